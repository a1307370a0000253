"""The coordinator interface: one restart budget and one view of the fleet shared by many agents.

A restart slot is taken with `acquire`: the backend reads every agent's restarts, asks the
caller's `admit` function (the budget) whether one more may start, and records it, all in one
atomic step, so two agents can never both take the last slot. The slot is leased: `renew` keeps
it, `release` frees it and records the outcome; a dead agent's slot frees itself when the lease
runs out (its restart is then counted as finished at the lease's end, outcome `lease-expired`).
Agents also `publish` their instances (leased too) and read everyone's with `fleet()`, so that
each derives the same plan.

One agent per namespace is the leader (`campaign`: a leased key in etcd, a leased row under the
SQLite lock on one host). Only the leader reads the whole fleet and the history and computes the
plan; it hands each other agent its `PlannedGrant`s (`write_grants`), each stamped with the
leader's fencing revision. The others keep only their own entries alive and read their grants
(`grants`); a grant counts only while its revision is the current leader's, and `acquire` checks
that atomically with the slot, so a grant from a deposed leader never starts a restart.

Agents also share what they learned of each workload (`put_profile`, `get_profiles`): a compact
profile per workload key, leased so a dead workload's profile expires, so that a new pod gets its
fleet's profile at once. The coordinator keeps them as opaque JSON objects (bounded in size); what
they mean is the detectors' business (`agent.detect.priors`).

Every method raises `CoordinatorUnavailable` when the backend cannot be reached in time; the
engine then does not restart anything.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from agent.core.figures import LATEST_TIME as LATEST  # a time past it in a record read back is no time
from agent.core.figures import is_number
from remediation.deadlines import Clocks, settle
from remediation.errors import CoordinatorError
from remediation.model import Decision, FleetEntry, RestartRecord
from remediation.text import at

# admit(records in flight or recent, the coordinator's now) -> the budget's decision
Admit = Callable[[Sequence[RestartRecord], float], Decision]
EXPIRED = "lease-expired"
MAX_PROFILE_BYTES = 4096  # a workload profile as JSON (they are under 2 KiB): more is refused
MAX_PROFILE_KEY = 200  # characters of a workload key
MAX_PROFILE_READ = 64  # keys one get_profiles call reads
MAX_PAUSE_BYTES = 4096  # a fleet pause record as JSON; a bigger one reads as unreadable (and holds)
UNREADABLE_PAUSE = "unreadable fleet pause record (lift it with `medic resume --fleet`)"


def profile_text(key: str, doc: Mapping[str, Any]) -> str:
    """`doc` as the JSON text kept under `key`; `CoordinatorError` when either is out of bounds
    (a key that is no path segment, a doc that is no JSON object or over `MAX_PROFILE_BYTES`)."""
    check_profile_key(key)
    if not isinstance(doc, Mapping):
        raise CoordinatorError(f"the profile of {key!r} must be a JSON object")
    try:
        text = json.dumps(dict(doc), sort_keys=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise CoordinatorError(f"the profile of {key!r} is not JSON: {exc}") from None
    if len(text.encode()) > MAX_PROFILE_BYTES:
        raise CoordinatorError(
            f"the profile of {key!r} is {len(text.encode())} bytes as JSON, over {MAX_PROFILE_BYTES}: not shared"
        )
    return text


def check_profile_key(key: str) -> None:
    """A workload key is one non-empty path segment of printable characters."""
    if (
        not isinstance(key, str)
        or not key
        or len(key) > MAX_PROFILE_KEY
        or "/" in key
        or not key.isprintable()
    ):
        raise CoordinatorError(
            f"bad workload key {key!r}: 1 to {MAX_PROFILE_KEY} printable characters, no '/'"
        )


def profile_doc(text: str) -> dict[str, Any] | None:
    """What a peer wrote, or None when it is no JSON object within the bound (skipped, never raised)."""
    if len(text.encode()) > MAX_PROFILE_BYTES:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_pause(text: str | None, now: float, clocks: Clocks | None = None) -> dict[str, Any] | None:
    """The fleet pause that `text` (what the coordinator holds, or None) records, while it holds at
    `now`: one whose time is up holds no more; one that is no JSON object within `MAX_PAUSE_BYTES`
    holds (fail closed) and says it is unreadable. Fields come back checked: `reason` and
    `by`/`agent` text, `until`/`since` unix times or None, the anchor on the boot clock of the host
    that set it (`remediation.deadlines`); others are dropped. Its time is told by that boot clock
    on the same host (so moving the wall clock does not end it), else by the wall clock."""
    if text is None:
        return None
    value = profile_doc(text) if len(text.encode()) <= MAX_PAUSE_BYTES else None
    if value is None:
        return {"reason": UNREADABLE_PAUSE, "until": None, "by": None, "since": None, "agent": None}
    record = {
        "reason": _text(value.get("reason"), 500) or "no reason given",
        "until": checked_time(value.get("until")),
        "by": _text(value.get("by"), 200),
        "since": checked_time(value.get("since")),
        "agent": _text(value.get("agent"), 200),
    }
    anchor = {"boot_id": _text(value.get("boot_id"), 64), "boot_until": value.get("boot_until")}
    if anchor["boot_id"] and is_number(anchor["boot_until"]):
        record.update(anchor)
    return None if pause_over(record, now, clocks) else record


def pause_over(record: Mapping[str, Any], now: float, clocks: Clocks | None = None) -> bool:
    """Whether the time of the pause `record` is up at `now` (the wall clock): on its boot clock
    when it was set on this boot, else on the wall clock (`remediation.deadlines.settle`)."""
    if record.get("until") is None:
        return False
    settled, _ = settle(record, now, clocks or Clocks())
    return bool(settled["until"] <= now)


def shown_pause(record: Mapping[str, Any], now: float, clocks: Clocks | None = None) -> dict[str, Any]:
    """The pause as people read it: `until` on today's wall clock, without its bookkeeping."""
    settled, _ = settle(record, now, clocks or Clocks())
    return {k: v for k, v in settled.items() if k not in ("boot_id", "boot_until")}


def _text(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def _time_or_never(value: Any) -> bool:
    """A time a grant may hold: a number a float can carry (±inf: never), not NaN nor a 400-digit int."""
    return is_number(value) or (isinstance(value, float) and math.isinf(value))


def checked_time(value: Any) -> float | None:
    """`value` as a unix time when it is a finite number between 1970 and 2100, else None."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if number and 0 <= value <= LATEST else None  # NaN and ±inf fail the range too


def fleet_pause_decision(pause: Mapping[str, Any]) -> Decision:
    """The verdict on an instance while the fleet-wide pause `pause` (from `read_pause`) holds."""
    until = pause.get("until")
    where = f" (set on {pause['agent']})" if pause.get("agent") else ""
    return Decision.block(
        "pause",
        "paused",
        f"remediation paused fleet-wide by {pause.get('by') or 'an operator'}{where} "
        f"until {at(until) if until is not None else '`medic resume --fleet`'}: {pause.get('reason')}",
        until,
        scope="fleet",
    )


@dataclass(frozen=True, slots=True)
class SlotRequest:
    instance: str
    fleet: str
    holder: str  # the agent's id
    ttl: float


@dataclass(frozen=True, slots=True)
class Grant:
    """A held restart slot; `token` identifies it to `renew` and `release`."""

    instance: str
    fleet: str
    holder: str
    token: str
    started_at: float
    ttl: float


@dataclass(frozen=True, slots=True)
class AcquireResult:
    grant: Grant | None
    decision: Decision

    @property
    def granted(self) -> bool:
        return self.grant is not None


@dataclass(frozen=True, slots=True)
class Leadership:
    """This agent plans for the namespace; `revision` fences its grants (etcd: the leader key's
    create_revision; local: the term, one more at each new leader)."""

    agent: str
    revision: int
    since: float | None = None  # when this agent took the seat (its own clock)


@dataclass(frozen=True, slots=True)
class PlannedGrant:
    """The leader's word that `instance` may try for a restart slot from `not_before` on."""

    instance: str
    fleet: str
    agent: str
    slot_at: float
    not_before: float
    revision: int
    deadline: float | None = None
    latest_start: float | None = None
    kind: str | None = None
    finding_id: str | None = None
    late: bool = False
    after: str | None = None
    reason: str = ""  # the leader's explanation of the slot

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Any) -> PlannedGrant:
        """Parse what the leader wrote; ValueError says what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("a grant must be an object")
        try:
            grant = cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
        except TypeError as exc:
            raise ValueError(f"bad grant: {exc}") from None
        numbers = (grant.slot_at, grant.not_before)
        if not all(_time_or_never(n) for n in numbers):
            raise ValueError("a grant's slot_at and not_before must be numbers")
        if not isinstance(grant.revision, int) or not isinstance(grant.instance, str):
            raise ValueError("a grant needs an instance name and an integer revision")
        optional = (grant.deadline, grant.latest_start)
        if not all(n is None or _time_or_never(n) for n in optional):
            raise ValueError("a grant's deadline and latest_start must be numbers or null")
        texts = (grant.fleet, grant.agent, grant.reason)
        if not all(isinstance(t, str) for t in texts) or not isinstance(grant.late, bool):
            raise ValueError("a grant's fleet, agent and reason must be text and late a boolean")
        if not all(t is None or isinstance(t, str) for t in (grant.kind, grant.finding_id, grant.after)):
            raise ValueError("a grant's kind, finding_id and after must be text or null")
        return grant


class Coordinator(ABC):
    """A backend: `local` (SQLite file) or `etcd` (leases over the JSON gateway)."""

    name: str = "?"

    @abstractmethod
    def acquire(self, request: SlotRequest, admit: Admit) -> AcquireResult:
        """Atomically: read restarts, ask `admit`, and if it allows, take a leased slot."""

    @abstractmethod
    def renew(self, grant: Grant) -> float:
        """Extend the slot's lease by its TTL; returns the new expiry. `LeaseLost` if it is gone."""

    @abstractmethod
    def release(self, grant: Grant, outcome: str) -> None:
        """Free the slot and record how the restart ended (idempotent)."""

    @abstractmethod
    def restarts(self, since: float) -> list[RestartRecord]:
        """Restarts in flight, and those started or finished at or after `since`, oldest first."""

    @abstractmethod
    def publish(self, agent: str, entries: Sequence[FleetEntry], ttl: float) -> None:
        """Replace what `agent` published with `entries`; they expire `ttl` seconds after the last publish."""

    @abstractmethod
    def fleet(self) -> list[FleetEntry]:
        """Every agent's published entries that have not expired, by instance name."""

    # ----------------------------------------------------------------------------- the elected planner
    @abstractmethod
    def campaign(self, agent: str, ttl: float, spread: float = 0.0) -> Leadership | None:
        """Become or stay the namespace's leader for `ttl` seconds; None while another agent is.

        `spread`: a vacant seat is claimed up to this many seconds late (by a per-agent hash), so a
        whole fleet does not campaign in the same instant after its leader died."""

    @abstractmethod
    def resign(self) -> None:
        """Give up leadership at once (a clean shutdown), so a successor need not wait for the TTL."""

    @abstractmethod
    def leader(self) -> str | None:
        """The current leader's agent id, or None while the seat is vacant."""

    def leader_info(self) -> dict[str, Any] | None:
        """The current leader as `{agent, revision, since}` (revision: its fencing revision or term;
        since: when it took the seat, None when unknown), or None while the seat is vacant."""
        agent = self.leader()
        return {"agent": agent, "revision": None, "since": None} if agent else None

    @abstractmethod
    def write_grants(self, leadership: Leadership, grants: Mapping[str, Sequence[PlannedGrant]]) -> int:
        """Replace every agent's grants with `grants` (agent -> its grants), fenced by `leadership`;
        agents left out have none. Writes only what changed; returns how many agents' grants were
        written. `LeaseLost` when `leadership` no longer holds (nothing is written then)."""

    @abstractmethod
    def grants(self, agent: str) -> list[PlannedGrant] | None:
        """`agent`'s grants from the current leader (none while the fleet is paused); None when
        they cannot be known now (a watch that is down): no restart until they can."""

    @abstractmethod
    def fleet_pause(self) -> dict[str, Any] | None:
        """The fleet-wide pause in force (`read_pause`), or None: while it holds the leader grants
        nothing and `acquire` takes no slot; it ends by itself at its `until`."""

    @abstractmethod
    def set_fleet_pause(self, pause: dict[str, Any] | None) -> None:
        """Set (a JSON object: reason, until, by, since, agent) or lift (None) the fleet-wide pause."""

    # ----------------------------------------------------------------------------- workload profiles
    @abstractmethod
    def put_profile(self, key: str, doc: Mapping[str, Any], ttl: float) -> None:
        """Share `doc` (a JSON object of at most `MAX_PROFILE_BYTES`) as workload `key`'s profile,
        replacing the last one; it expires `ttl` seconds later unless put again. `CoordinatorError`
        for a bad key or doc (`profile_text`)."""

    @abstractmethod
    def get_profiles(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The unexpired profiles of `keys` (at most `MAX_PROFILE_READ`), by key; a key with none,
        or with a doc that is not a JSON object, is left out."""

    def describe(self) -> str:
        return self.name

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (not slots: those expire by themselves)."""
