"""The one table of event kinds that concern people, and what each does to notifications.

An event kind maps to a `Route`:

- `effect` on the alert named by `key`: `fire` (opens or updates an alert that stays active until
  resolved; Alertmanager gets it re-posted), `resolve` (ends it), `once` (a one-shot alert that
  Alertmanager ends by itself after `lasts`), or None (a message only, e.g. pause/resume).
- Webhook and Slack sinks get one message per routed event; a `resolve` goes only to the sinks that
  got the `fire` (a restart seen after `instance_down` reports "resolved" to them, and nothing else).
- `gated`: subject to `min_severity` (findings); the other kinds are always worth a human.
- `silence`/`unsilence`: restart events hold and release Alertmanager silences.

The remediation engine names its events `remediation_*`; `ALIASES` maps them to the canonical kinds
here, so the table does not care which part emitted an event. `external` findings came from
Alertmanager: they are never posted back to it (`NOT_POSTED_BACK`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from agent.core.records import Event

Effect = Literal["fire", "resolve", "once"]

ALIASES: dict[str, str] = {
    "remediation_restart_planned": "restart_planned",
    "remediation_restart_started": "restart_started",
    "remediation_restart_succeeded": "restart_done",
    "remediation_restart_failed": "restart_failed",
    "remediation_restart_skipped": "restart_skipped",
    "remediation_restart_interrupted": "restart_interrupted",
    "remediation_interrupted": "restart_interrupted",
    "remediation_escalated": "escalated",
    "remediation_escalation_cleared": "escalation_cleared",
    "remediation_escalation_expired": "escalation_cleared",
    "remediation_budget_exhausted": "budget_exhausted",
    "remediation_coordinator_unavailable": "coordinator_unreachable",
    "remediation_coordinator_recovered": "coordinator_recovered",
    "remediation_plan_infeasible": "plan_infeasible",
    "remediation_paused": "paused",
    "remediation_resumed": "resumed",
}
FINDING_ALERTS: dict[str, str] = {
    "leak": "MedicLeak",
    "oom-risk": "MedicOOMRisk",
    "fragmentation": "MedicFragmentation",
    "slow": "MedicSlow",
    "external": "MedicExternal",
}
NOT_POSTED_BACK = frozenset({"external"})
# what on-call reads under each alert's summary: the first look and the command for it ({name}: the
# instance); the runbook (docs/runbooks.md, the section named after the alert) says the rest
DESCRIPTIONS: dict[str, str] = {
    "MedicLeak": "medic found {name}'s memory growing steadily. `medic leaks {name}` names what grows; "
    "`medic plan` shows the restart planned, if any.",
    "MedicOOMRisk": "{name} is heading for its memory limit. `medic plan` shows whether a restart comes "
    "first; `medic restart {name}` restarts it now, within the budget.",
    "MedicFragmentation": "{name}'s allocator holds far more memory than is in use: fragmentation or "
    "retention, not a leak. `medic purge {name}` returns free pages now.",
    "MedicSlow": "{name} is slow: over its SLO, far above its peers or degrading. The summary names the "
    "rule and the likely cause; `medic status` shows the latency of every instance.",
    "MedicFinding": "`medic events --instance {name}` shows the finding and its evidence.",
    "MedicInstanceDown": "medic finds no running process for {name}. `medic events --instance {name}` "
    "says when it went and how it ended.",
    "MedicEscalated": "medic stopped repairing {name} by itself: its remedies did not hold. After a look, "
    "`medic clear {name}` lets it act again.",
    "MedicRestartFailed": "A restart of {name} did not bring it back healthy. `medic actions` shows the "
    "attempt and its evidence.",
    "MedicBudgetExhausted": "Restarts wait: the fleet's restart budget is used up. `medic plan` shows "
    "what waits and until when.",
    "MedicCoordinatorUnreachable": "medic cannot reach its coordinator, so it restarts nothing (it fails "
    "closed). Check the etcd endpoints of remediation.coordinator.",
}


def description_for(alertname: str | None, instance: str | None) -> str | None:
    text = DESCRIPTIONS.get(alertname or "")
    return text.replace("{name}", instance or "the instance") if text else None


def canonical(kind: str) -> str:
    return ALIASES.get(kind, kind)


def finding_of(event: Event) -> dict[str, Any]:
    finding = event.data.get("finding")
    return finding if isinstance(finding, dict) else {}


def _finding_key(event: Event) -> str:
    finding = finding_of(event)
    return f"finding/{finding.get('instance') or event.instance}/{finding.get('kind', 'unknown')}"


def _finding_alertname(event: Event) -> str:
    return FINDING_ALERTS.get(str(finding_of(event).get("kind")), "MedicFinding")


def _per_instance(prefix: str) -> Callable[[Event], str]:
    return lambda event: f"{prefix}/{event.instance or '-'}"


def _per_action(prefix: str) -> Callable[[Event], str]:
    return lambda event: f"{prefix}/{event.instance or '-'}/{event.data.get('action_id', event.id)}"


@dataclass(frozen=True, slots=True)
class Route:
    effect: Effect | None = None
    alertname: str | Callable[[Event], str] | None = None
    key: Callable[[Event], str] | None = None
    gated: bool = False
    lasts: float = 3600.0  # `once` alerts end this long after the event
    silence: bool = False
    unsilence: bool = False

    def alert_name(self, event: Event) -> str | None:
        return self.alertname(event) if callable(self.alertname) else self.alertname


class _AlertOf(TypedDict, total=False):
    """The alert several kinds of `ROUTES` fire and resolve alike."""

    alertname: str | Callable[[Event], str]
    key: Callable[[Event], str]
    gated: bool


_FINDING: _AlertOf = {"alertname": _finding_alertname, "key": _finding_key, "gated": True}
_DOWN: _AlertOf = {"alertname": "MedicInstanceDown", "key": _per_instance("instance_down")}
_ESCALATED: _AlertOf = {"alertname": "MedicEscalated", "key": _per_instance("escalated")}
_COORDINATOR: _AlertOf = {
    "alertname": "MedicCoordinatorUnreachable",
    "key": lambda e: "coordinator_unreachable",
}

ROUTES: dict[str, Route] = {
    "finding_opened": Route("fire", **_FINDING),
    "finding_updated": Route("fire", **_FINDING),
    "finding_resolved": Route("resolve", **_FINDING),
    "restart_planned": Route(),
    "restart_started": Route(silence=True),
    "restart_done": Route(unsilence=True),
    "restart_failed": Route(
        "once", "MedicRestartFailed", _per_action("restart_failed"), unsilence=True, lasts=3600.0
    ),
    "restart_skipped": Route(unsilence=True),
    "restart_interrupted": Route(unsilence=True),
    "escalated": Route("fire", **_ESCALATED),
    "escalation_cleared": Route("resolve", **_ESCALATED),
    "budget_exhausted": Route("once", "MedicBudgetExhausted", lambda e: "budget_exhausted", lasts=3600.0),
    "coordinator_unreachable": Route("fire", **_COORDINATOR),
    "coordinator_recovered": Route("resolve", **_COORDINATOR),
    "plan_infeasible": Route(),
    "paused": Route(),
    "resumed": Route(),
    "instance_down": Route("fire", **_DOWN),
    "instance_restarted": Route("resolve", **_DOWN),
    "instance_resumed": Route("resolve", **_DOWN),
    "instance_discovered": Route("resolve", **_DOWN),
}


def route_for(kind: str) -> Route | None:
    return ROUTES.get(canonical(kind))


# every alert medic posts to Alertmanager (each has a runbook section and a description)
PUSHED_ALERTS = frozenset(
    {name for kind, name in FINDING_ALERTS.items() if kind not in NOT_POSTED_BACK}
    | {"MedicFinding"}
    | {route.alertname for route in ROUTES.values() if route.effect and isinstance(route.alertname, str)}
)
