"""The fleet-wide pause as one agent sets, lifts and watches it.

`pause` writes it to the coordinator (`ElectedPlanner.set_fleet_pause`), and every agent of the
namespace holds while it lasts (read each step, with the leader, by the elected planner); it needs
a coordinator shared with other agents (`shared` says why not: `NotShared`). The agent that set a
pause says when it expired (`note_expiry`); the others only hold, and say so in their decisions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.core.ports import EventSink
from remediation.coordinator import Coordinator
from remediation.errors import NotShared
from remediation.grants import ElectedPlanner
from remediation.text import at


class FleetPause:
    def __init__(
        self,
        coordinator: Coordinator,
        planning: ElectedPlanner,
        events: EventSink,
        *,
        agent_id: str,
        state_dir: Path,
        clock: Callable[[], float],
    ) -> None:
        self.coordinator = coordinator
        self.planning = planning
        self.events = events
        self.agent_id = agent_id
        self.state_dir = state_dir
        self.clock = clock
        self._seen: dict[str, Any] | None = None  # the fleet pause the last step saw

    def at(self, now: float) -> dict[str, Any] | None:
        """The fleet-wide pause in force at `now`, as the last step read it (no coordinator request)."""
        return self.planning.control.pause_at(now)

    def pause(self, reason: str, until: float, by: str | None = None) -> dict[str, Any]:
        """No agent of the namespace purges or restarts anything until `until` or `resume()`.
        Written to the coordinator at once; `NotShared` when this agent's coordinator is its own,
        `CoordinatorError` when it cannot be written (nothing paused then), ValueError without a
        reason or a future expiry."""
        self._check_shared()
        now = self.clock()
        if not reason or not reason.strip():
            raise ValueError("a pause needs a reason (who is doing what, for how long)")
        if not math.isfinite(until) or until <= now:
            raise ValueError("a pause needs an expiry in the future")
        record = {"reason": reason.strip(), "until": until, "by": by, "since": now, "agent": self.agent_id}
        self.planning.set_fleet_pause(record, now)
        paused = self.planning.control.pause_at(now) or record
        self._seen = paused
        self.events.emit(
            "remediation_paused",
            f"remediation paused fleet-wide ({self.coordinator.describe()}) until {at(until)} "
            f"by {by or 'an operator'}: {paused['reason']}",
            severity="warning",
            scope="fleet",
            **paused,
        )
        return paused

    def resume(self, by: str | None = None) -> dict[str, Any] | None:
        """Lift the fleet-wide pause; returns the one lifted, or None when there was none (same
        errors as `pause`)."""
        self._check_shared()
        previous = self.planning.set_fleet_pause(None, self.clock())
        self._seen = None
        if previous is not None:
            self.events.emit(
                "remediation_resumed",
                f"remediation resumed fleet-wide ({self.coordinator.describe()}) by {by or 'an operator'}; "
                f"the pause was: {previous.get('reason')}",
                scope="fleet",
                by=by,
                previous=previous,
            )
        return previous

    def shared(self) -> str | None:
        """None when the coordinator is shared with other agents (etcd, or a local file named in
        the config); else why not."""
        path = getattr(self.coordinator, "path", None)
        if self.coordinator.name != "local" or path is None:
            return None
        if Path(path).resolve() != (self.state_dir / "coordinator.db").resolve():
            return None
        return (
            f"this agent has no shared coordinator: its coordinator is the SQLite file {path} in its own "
            "state directory, which no other agent uses, so a fleet-wide pause would hold only this agent; "
            "use `medic pause` (without --fleet), or share one coordinator between the agents "
            "(remediation.coordinator.local.path on one host, backend: etcd across hosts)"
        )

    def _check_shared(self) -> None:
        why = self.shared()
        if why is not None:
            raise NotShared(why)

    def note_expiry(self, now: float) -> None:
        """The agent that set the fleet pause says when it expired (the others only hold, and say
        so in their decisions)."""
        seen, self._seen = self._seen, self.at(now)
        until = seen.get("until") if seen else None
        if seen is None or self._seen is not None or seen.get("agent") != self.agent_id:
            return
        if until is not None and until <= now:
            self.events.emit(
                "remediation_resumed",
                f"the fleet-wide pause ({seen.get('reason')}) expired",
                scope="fleet",
                **seen,
            )

    def describe(self, now: float, namespace: str) -> dict[str, Any]:
        """The fleet's controls as the last step read them (`medic plan`'s `fleet`)."""
        control = self.planning.control
        leader = control.leader
        return {
            "namespace": namespace,
            "shared": self.shared() is None,
            "paused": control.pause_at(now),
            "leader": dict(leader) if leader else None,
            "leads": bool(leader and leader.get("agent") == self.agent_id),
            "role": control.role,
            "read_at": control.read_at,
            "error": control.error,
        }
