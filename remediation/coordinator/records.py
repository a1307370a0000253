"""The records the coordinator and its callers share: a slot asked for and held, the leader's seat,
and the leader's grants (what the leader writes, parsed defensively: another writer may be wrong)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from agent.core.figures import is_number
from remediation.model import Decision, RestartRecord

# admit(records in flight or recent, the coordinator's now) -> the budget's decision
Admit = Callable[[Sequence[RestartRecord], float], Decision]
EXPIRED = "lease-expired"


def json_object(text: str, limit: int) -> dict[str, Any] | None:
    """`text` as a JSON object of at most `limit` bytes, or None (what another agent wrote: skipped)."""
    if len(text.encode()) > limit:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _time_or_never(value: Any) -> bool:
    """A time a grant may hold: a number a float can carry (±inf: never), not NaN nor a 400-digit int."""
    return is_number(value) or (isinstance(value, float) and math.isinf(value))


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
    """This agent plans for the namespace; `revision`, its seat's create revision in the store,
    fences its grants."""

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
