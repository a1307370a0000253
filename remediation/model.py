"""Plain records the remediation engine takes in and gives out, so that the detectors, the runtime,
the API and the coordinator backends agree on field names.

Inputs: `RemediationRequest` (a finding asks for help) and `InstanceView` (what is running now).
Outputs: `Decision` (one stage's verdict with its reason), `Intent` (what the ladder wants),
`FleetEntry` (what an agent publishes about an instance), `RestartRecord` (one restart the budget
counts), `PlanEntry`/`Plan` (the schedule), `StepReport` (one engine step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args, get_type_hints

from agent.core.figures import is_number

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

RequestKind = Literal["leak", "oom-risk", "fragmentation", "slow", "external", "manual", "crash-loop"]
REQUEST_KINDS: tuple[str, ...] = (
    "leak",
    "oom-risk",
    "fragmentation",
    "slow",
    "external",
    "manual",
    "crash-loop",
)
# When one instance has several requests, the most urgent kind leads (a restart fixes all of them;
# a crash loop leads them all: it escalates, and no restart can fix it).
KIND_PRIORITY: dict[str, int] = {
    "crash-loop": -1,
    "oom-risk": 0,
    "leak": 1,
    "manual": 2,
    "external": 3,
    "slow": 4,
    "fragmentation": 5,
}
DEFAULT_FLEET = "default"
# a restart dry-run mode reached and recorded without doing it (`remediation.dry_run`)
WOULD_RESTART = "would-restart"


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
    # the whole finding (id, kind, verdict, summary, suspects, attribution), kept as finding.json
    finding: Mapping[str, Any] = field(default_factory=dict)

    def finding_record(self) -> dict[str, Any]:
        """What `finding.json` holds: the finding as the detectors made it, with its evidence."""
        record: dict[str, Any] = {
            "id": self.finding_id,
            "instance": self.instance,
            "kind": self.kind,
            "summary": self.reason,
            **dict(self.finding),
        }
        evidence = dict(record.get("evidence") or self.evidence)
        record["evidence"] = evidence
        for key in ("suspects", "attribution"):
            record.setdefault(key, evidence.get(key))
        record.setdefault("verdict", None)
        return record

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
        return record_dict(self)


@dataclass(frozen=True, slots=True)
class WouldRestart:
    """The would-be restart dry-run recorded for one process of an instance."""

    action_id: int
    at: float  # when dry-run would have restarted it
    start_time: float  # the process it would have restarted
    reason: str


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
class Lifetime:
    """One process of an instance as the supervisor or the tracker recorded it: when it started,
    when it ended (None: it still runs) and how (`exit_status`, None when unknown)."""

    start: float
    end: float | None = None
    exit_status: int | None = None
    pid: int | None = None

    def uptime(self, now: float) -> float:
        return max(0.0, (now if self.end is None else self.end) - self.start)

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)


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
        return record_dict(self)


Action = Literal["none", "wait", "purge", "restart", "escalate"]


@dataclass(frozen=True, slots=True)
class Intent:
    """What the ladder wants for an instance now, and why."""

    action: Action
    code: str
    reason: str
    deadline: float | None = None  # restart intents: by when; None means as soon as allowed

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)


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
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: Any) -> FleetEntry:
        """Parse what another agent wrote; ValueError says which field is wrong."""
        return record_from_dict(cls, data, "fleet entry")


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
        return record_dict(self)

    @classmethod
    def from_dict(cls, data: Any) -> RestartRecord:
        """Parse a record of the coordinator's history; ValueError says which field is wrong."""
        return record_from_dict(cls, data, "restart record")


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
    hopeless: bool  # even its earliest slot ends after the projected OOM: not acted on
    reason: str
    after: str | None = None  # the instance planned just before in the same fleet
    held_by: str | None = None  # the budget limit or window that moved the slot later (its code)
    dry_run: bool = False  # a would-be restart dry-run recorded at `slot_at`: nothing was restarted

    @property
    def actionable(self) -> bool:
        return not self.hopeless and math.isfinite(self.slot_at)

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)


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
            **record_dict(self, skip=("computed_at",)),
        }


@dataclass
class StepReport:
    """What one engine step decided: the plan, each instance's decision and intent, what started."""

    now: float
    mode: str
    plan: Plan
    decisions: dict[str, Decision] = field(default_factory=dict)
    intents: dict[str, Intent] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    coordinator_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "now": self.now,
            "mode": self.mode,
            "plan": self.plan.to_dict(),
            "decisions": {k: v.to_dict() for k, v in sorted(self.decisions.items())},
            "intents": {k: v.to_dict() for k, v in sorted(self.intents.items())},
            "started": self.started,
            "coordinator_error": self.coordinator_error,
        }


# ----------------------------------------------------------------------------- dicts of records
def record_dict(record: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """A record's fields in order, ready for JSON: mappings copied as dicts, tuples as lists
    (of dicts, for tuples of records)."""
    return {f.name: _plain(getattr(record, f.name)) for f in fields(record) if f.name not in skip}


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return record_dict(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


_R = TypeVar("_R", bound="DataclassInstance")


def record_from_dict(cls: type[_R], data: Any, what: str) -> _R:
    """A record from what another agent wrote, each field checked against its annotation (`str`
    non-empty unless it has a default, `float` finite, `bool` taken as truthy; None or missing means
    the default); ValueError names the field that is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"bad {what}: expected an object, got {type(data).__name__}")
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    try:
        for f in fields(cls):
            value = data.get(f.name)
            if value is None:
                if f.default is MISSING:
                    if type(None) not in get_args(hints[f.name]):
                        raise ValueError(f"{f.name} is missing")
                    values[f.name] = None
                continue
            values[f.name] = _checked(f.name, value, hints[f.name], required=f.default is MISSING)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"bad {what}: {exc}") from None
    return cls(**values)


def _checked(name: str, value: Any, hint: Any, *, required: bool) -> Any:
    kinds = set(get_args(hint)) - {type(None)} or {hint}
    if kinds == {bool}:
        return bool(value)
    if kinds == {float}:
        if not is_number(value):  # finite, and no int too wide for a float
            raise ValueError(f"{name} must be a finite number, got {repr(value)[:40]}")
        return float(value)
    if kinds == {str}:
        if not isinstance(value, str) or (required and not value):
            raise ValueError(f"{name} must be a {'non-empty ' if required else ''}string, got {value!r}")
        return value
    raise TypeError(f"{name}: no parser for {hint!r}")
