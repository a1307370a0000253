"""The coordinator interface: one restart budget and one view of the fleet shared by many agents.

A restart slot is taken with `acquire`: the backend reads every agent's restarts, asks the
caller's `admit` function (the budget) whether one more may start, and records it, all in one
atomic step, so two agents can never both take the last slot. The slot is leased: `renew` keeps
it, `release` frees it and records the outcome; a dead agent's slot frees itself when the lease
runs out (its restart is then counted as finished at the lease's end, outcome `lease-expired`).
Agents also `publish` their instances (leased too) and read everyone's with `fleet()`, so that
each derives the same plan.

Every method raises `CoordinatorUnavailable` when the backend cannot be reached in time; the
engine then does not restart anything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from remediation.model import Decision, FleetEntry, RestartRecord

# admit(records in flight or recent, the coordinator's now) -> the budget's decision
Admit = Callable[[Sequence[RestartRecord], float], Decision]
EXPIRED = "lease-expired"


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

    def describe(self) -> str:
        return self.name

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (not slots: those expire by themselves)."""
