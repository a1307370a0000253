"""Plain records the remediation engine takes in and gives out, so that the detectors, the runtime,
the API and the coordinator backends agree on field names.

Inputs: `RemediationRequest` (a finding asks for help) and `InstanceView` (what is running now).
Outputs: `Decision` (one stage's verdict with its reason), `Intent` (what the ladder wants),
`FleetEntry` (what an agent publishes about an instance), `RestartRecord` (one restart the budget
counts), `PlanEntry`/`Plan` (the schedule).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

RequestKind = Literal["leak", "oom-risk", "fragmentation", "slow", "external", "manual"]
REQUEST_KINDS: tuple[str, ...] = ("leak", "oom-risk", "fragmentation", "slow", "external", "manual")
# When one instance has several requests, the most urgent kind leads (a restart fixes all of them).
KIND_PRIORITY: dict[str, int] = {
    "oom-risk": 0,
    "leak": 1,
    "manual": 2,
    "external": 3,
    "slow": 4,
    "fragmentation": 5,
}
DEFAULT_FLEET = "default"


@dataclass(frozen=True, slots=True)
class RemediationRequest:
    """A finding (or a person, or Alertmanager) asks for an instance to be remedied.

    `deadline` is the unix time by which the instance must be restarted (the projected OOM), or
    None for "as soon as the budget allows". `start_time` names the process the finding is about:
    when the instance now runs a different process, the request is stale and ignored. `force`
    (manual only) skips the plan, the budget, the blockers and the windows; it is logged.
    """

    instance: str
    kind: RequestKind
    finding_id: str
    reason: str
    deadline: float | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    start_time: float | None = None
    requested_at: float | None = None
    force: bool = False
    requested_by: str | None = None

    def problem(self) -> str | None:
        """What is wrong with this request, or None: bad input is reported, never raised into the agent."""
        if not isinstance(self.instance, str) or not self.instance:
            return "the request names no instance"
        if self.kind not in REQUEST_KINDS:
            return f"unknown request kind {self.kind!r}; expected one of {', '.join(REQUEST_KINDS)}"
        if not isinstance(self.finding_id, str) or not self.finding_id:
            return "the request has no finding id"
        for name in ("deadline", "start_time", "requested_at"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            ):
                return f"{name} must be a finite unix time or None, got {value!r}"
        if self.force and self.kind != "manual":
            return "only manual requests may be forced"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "kind": self.kind,
            "finding_id": self.finding_id,
            "reason": self.reason,
            "deadline": self.deadline,
            "evidence": dict(self.evidence),
            "start_time": self.start_time,
            "requested_at": self.requested_at,
            "force": self.force,
            "requested_by": self.requested_by,
        }


@dataclass(frozen=True, slots=True)
class InstanceView:
    """What the engine knows of one local instance right now (built by the runtime from its tracker)."""

    name: str
    pid: int | None
    start_time: float | None
    cmdline: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    ready: bool = True  # up and healthy; False counts against the fleet's capacity floor
    managed: bool = False  # launched by medic (`command:`): the default actuator is `managed`

    @property
    def fleet(self) -> str:
        return self.labels.get("fleet") or DEFAULT_FLEET

    @property
    def up(self) -> bool:
        return self.pid is not None and self.start_time is not None

    def uptime(self, now: float) -> float | None:
        return None if self.start_time is None else max(0.0, now - self.start_time)


@dataclass(frozen=True, slots=True)
class Decision:
    """One stage's verdict on one instance, always with a reason a person can act on."""

    ok: bool
    stage: str
    code: str
    reason: str
    retry_at: float | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def allow(cls, stage: str, reason: str, code: str = "ok", **data: Any) -> Decision:
        return cls(True, stage, code, reason, None, data)

    @classmethod
    def block(
        cls, stage: str, code: str, reason: str, retry_at: float | None = None, **data: Any
    ) -> Decision:
        return cls(False, stage, code, reason, retry_at, data)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "stage": self.stage,
            "code": self.code,
            "reason": self.reason,
            "retry_at": self.retry_at,
            "data": dict(self.data),
        }


Action = Literal["none", "wait", "purge", "restart", "escalate"]


@dataclass(frozen=True, slots=True)
class Intent:
    """What the ladder wants for an instance now, and why."""

    action: Action
    code: str
    reason: str
    deadline: float | None = None  # restart intents: by when; None means as soon as allowed

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "code": self.code, "reason": self.reason, "deadline": self.deadline}


@dataclass(frozen=True, slots=True)
class FleetEntry:
    """What one agent publishes about one instance through the coordinator (leased: it expires)."""

    instance: str
    fleet: str
    agent: str
    ready: bool = True
    wants_restart: bool = False
    kind: str | None = None
    finding_id: str | None = None
    deadline: float | None = None
    requested_at: float | None = None
    updated_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "fleet": self.fleet,
            "agent": self.agent,
            "ready": self.ready,
            "wants_restart": self.wants_restart,
            "kind": self.kind,
            "finding_id": self.finding_id,
            "deadline": self.deadline,
            "requested_at": self.requested_at,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_dict(cls, data: Any) -> FleetEntry:
        """Parse what another agent wrote; ValueError says which field is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        try:
            return cls(
                instance=_text(data, "instance"),
                fleet=_text(data, "fleet"),
                agent=_text(data, "agent"),
                ready=bool(data.get("ready", True)),
                wants_restart=bool(data.get("wants_restart", False)),
                kind=_opt_text(data, "kind"),
                finding_id=_opt_text(data, "finding_id"),
                deadline=_opt_time(data, "deadline"),
                requested_at=_opt_time(data, "requested_at"),
                updated_at=_opt_time(data, "updated_at") or 0.0,
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad fleet entry: {exc}") from None


@dataclass(frozen=True, slots=True)
class RestartRecord:
    """One restart the budget counts: in flight while `finished_at` is None."""

    instance: str
    fleet: str
    holder: str
    started_at: float
    finished_at: float | None = None
    outcome: str | None = None
    token: str = ""

    @property
    def in_flight(self) -> bool:
        return self.finished_at is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "fleet": self.fleet,
            "holder": self.holder,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "outcome": self.outcome,
            "token": self.token,
        }

    @classmethod
    def from_dict(cls, data: Any) -> RestartRecord:
        if not isinstance(data, dict):
            raise ValueError(f"bad restart record: expected an object, got {type(data).__name__}")
        try:
            started = _opt_time(data, "started_at")
            if started is None:
                raise ValueError("started_at is missing")
            return cls(
                instance=_text(data, "instance"),
                fleet=_text(data, "fleet"),
                holder=_text(data, "holder"),
                started_at=started,
                finished_at=_opt_time(data, "finished_at"),
                outcome=_opt_text(data, "outcome"),
                token=str(data.get("token") or ""),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad restart record: {exc}") from None


@dataclass(frozen=True, slots=True)
class PlanEntry:
    """One planned restart: when, why then, and whether it still meets its deadline."""

    instance: str
    fleet: str
    agent: str
    slot_at: float
    latest_start: float | None  # None: no deadline (as soon as allowed)
    deadline: float | None
    kind: str | None
    finding_id: str | None
    late: bool
    reason: str
    after: str | None = None  # the instance planned just before in the same fleet
    hopeless: bool = False  # even its earliest slot ends after the projected OOM: not acted on

    @property
    def actionable(self) -> bool:
        return not self.hopeless and math.isfinite(self.slot_at)

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "fleet": self.fleet,
            "agent": self.agent,
            "slot_at": self.slot_at,
            "latest_start": self.latest_start,
            "deadline": self.deadline,
            "kind": self.kind,
            "finding_id": self.finding_id,
            "late": self.late,
            "hopeless": self.hopeless,
            "reason": self.reason,
            "after": self.after,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """The fleet's restart schedule, earliest slot first; `problems` say what cannot be met and why."""

    computed_at: float
    entries: tuple[PlanEntry, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def feasible(self) -> bool:
        return not any(entry.late for entry in self.entries)

    @property
    def hopeless(self) -> tuple[PlanEntry, ...]:
        return tuple(entry for entry in self.entries if entry.hopeless)

    def entry(self, instance: str) -> PlanEntry | None:
        for entry in self.entries:
            if entry.instance == instance:
                return entry
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "computed_at": self.computed_at,
            "feasible": self.feasible,
            "problems": list(self.problems),
            "entries": [entry.to_dict() for entry in self.entries],
        }


def _text(data: dict, key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be a non-empty string, got {value!r}")
    return value


def _opt_text(data: dict, key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {value!r}")
    return value


def _opt_time(data: dict, key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    return float(value)
