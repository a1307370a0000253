"""The shared view every agent plans from: its own instances published, everyone's read back.

Each agent publishes one `FleetEntry` per local instance (ready? wants a restart? by when?) with
a lease. The elected leader (`remediation.grants`) reads every agent's entries and the shared
restart history and plans; `shared_view` is the read-everything path that dry-run keeps (every
agent plans for itself). Without the coordinator, the view shrinks to this agent's own instances
and no history, and the error says why (no restart will start).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from remediation.budget import HOUR
from remediation.config import RemediationSection
from remediation.coordinator import Coordinator
from remediation.errors import CoordinatorError
from remediation.model import FleetEntry, InstanceView, Intent, RemediationRequest, RestartRecord


def history_window(config: RemediationSection) -> float:
    """How far back restarts matter: the hourly limit, the cooldown, the crash-loop window, twice over."""
    loop = config.ladder.crash_loop
    return 2 * max(HOUR, config.budget.cooldown, loop.window + loop.reset_after, config.budget.min_interval)


def local_entries(
    agent_id: str,
    views: Mapping[str, InstanceView],
    primary: Mapping[str, RemediationRequest],
    wanted: Mapping[str, Intent],
    first_seen: Callable[[str, str], float | None],
    now: float,
) -> list[FleetEntry]:
    """This agent's instances as it publishes them; `first_seen(instance, finding)` orders requests."""
    entries = []
    for view in views.values():
        intent = wanted.get(view.name)
        request = primary.get(view.name) if intent else None
        entries.append(
            FleetEntry(
                instance=view.name,
                fleet=view.fleet,
                agent=agent_id,
                ready=view.ready and view.up,
                wants_restart=intent is not None,
                kind=request.kind if request else None,
                finding_id=request.finding_id if request else None,
                deadline=intent.deadline if intent else None,
                requested_at=first_seen(view.name, request.finding_id) if request else None,
                updated_at=now,
            )
        )
    return entries


def shared_view(
    coordinator: Coordinator, agent_id: str, mine: list[FleetEntry], ttl: float, since: float
) -> tuple[list[FleetEntry], list[RestartRecord], str | None]:
    """(every agent's entries, restarts since `since`, the coordinator's error or None)."""
    try:
        coordinator.publish(agent_id, mine, ttl)
        fleet = coordinator.fleet()
        history = coordinator.restarts(since)
    except CoordinatorError as exc:
        return list(mine), [], str(exc)
    names = {e.instance for e in mine}  # this agent's view of its own instances is the freshest
    return [*mine, *(e for e in fleet if e.instance not in names)], history, None
