"""The coordinator: one restart budget and one view of the fleet shared by many agents, as the
fleet's rules (written once) over a lease store (`store.py`: SQLite for one host, etcd for many).

A restart slot is taken with `acquire`: one read of the slots, the history and the controls, the
caller's `admit` function (the budget) asked whether one more may start, and one commit that holds
only if nothing it read changed, so two agents can never both take the last slot (`slots.py`). The
slot is leased: `renew` keeps it, `release` frees it and records the outcome; a dead agent's slot
frees itself when the lease runs out (its restart is then counted as finished at the lease's end,
outcome `lease-expired`). Agents also `publish` their instances (leased too, `fleet_entries.py`)
and read everyone's with `fleet()`, so that each derives the same plan.

One agent per namespace is the leader (`campaign`, `seat.py`: a leased key created only while
absent). Only the leader reads the whole fleet and the history and computes the plan; it hands each
other agent its `PlannedGrant`s (`write_grants`), each stamped with the seat's fencing revision.
The others keep only their own entries alive and read their grants (`grants`); a grant counts only
while its revision is the current seat's, and `acquire` checks that in the same commit as the slot,
so a grant from a deposed leader never starts a restart. The fleet-wide pause (`controls.py`) holds
the grants and the slots; workload profiles (`profiles.py`) are shared under leases.

Every method raises `CoordinatorUnavailable` when the store cannot be reached in time, and a race
lost `ATTEMPTS` times in a row is one too; the engine then does not restart anything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from remediation.coordinator import controls, fleet_entries, profiles, seat, slots
from remediation.coordinator.controls import (
    checked_time,
    fleet_pause_decision,
    pause_over,
    read_pause,
    shown_pause,
)
from remediation.coordinator.profiles import MAX_PROFILE_READ, profile_text
from remediation.coordinator.records import (
    EXPIRED,
    AcquireResult,
    Admit,
    Grant,
    Leadership,
    PlannedGrant,
    SlotRequest,
)
from remediation.coordinator.store import LeaseStore, chunks
from remediation.deadlines import Clocks
from remediation.errors import CoordinatorError, CoordinatorUnavailable, LeaseLost
from remediation.model import Decision, FleetEntry, RestartRecord

ATTEMPTS = 5  # races for a slot lost in a row before the coordinator counts as unavailable


class Coordinator:
    """The fleet's rules over `store`; `LocalCoordinator` and `EtcdCoordinator` build the store."""

    name: str = "?"

    def __init__(
        self, store: LeaseStore, *, retention: float = 86400.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.retention = retention
        self.clock = clock
        self.clocks = Clocks.for_wall(clock)  # how long a fleet pause lasts (remediation.deadlines)
        self._lock = threading.Lock()
        self._held: dict[str, tuple[str, dict[str, Any]]] = {}  # token -> (record key, record)
        self._fleet_lease = 0
        self._fleet_renewed = 0.0  # monotonic time of the fleet lease's last grant or keepalive
        self._published: dict[str, str] = {}  # instance -> what this agent last wrote (no updated_at)
        self._parsed: fleet_entries.Parsed = {}
        self._leadership: Leadership | None = None
        self._leader_lease = 0
        self._leader_renewed = 0.0
        self._vacant_since: float | None = None
        self._written: dict[str, str] = {}  # agent -> grants document the leader last wrote
        self._fences: dict[str, int] = {}  # instance -> the revision its grant requires at acquire
        self._profile_lease = (0, 0.0)  # (lease, ttl) this agent's shared profiles hang on

    def describe(self) -> str:
        return self.store.describe()

    def close(self) -> None:
        """Release connections (not slots: those expire by themselves)."""
        self.store.close()

    # ----------------------------------------------------------------------------- slots
    def acquire(self, request: SlotRequest, admit: Admit) -> AcquireResult:
        """Read restarts, ask `admit`, and if it allows, take a leased slot: all or nothing."""
        fence = self._fence_for(request.instance)
        for _ in range(ATTEMPTS):
            snapshot = self.store.read(slots.ACQUIRE)
            now = self.clock()
            refused = slots.refusal(snapshot, request, now, self.clocks, fence)
            if refused is not None:
                if refused.code == "stale-grant":
                    with self._lock:
                        self._fences.pop(request.instance, None)
                return AcquireResult(None, refused)
            decision = admit(slots.records(snapshot, now - self.retention), now)
            if not decision.ok:
                return AcquireResult(None, decision)
            lease = self.store.grant(request.ttl)
            prune = slots.expired(snapshot, now, self.retention)[: self.store.max_ops - 3]
            change, key, record = slots.acquisition(snapshot, request, now, lease, fence=fence, prune=prune)
            try:
                taken = self.store.commit(change)
            except CoordinatorError:
                self._revoke_quietly(lease)
                raise
            if taken is not None:
                with self._lock:
                    self._held[str(lease)] = (key, record)
                grant = Grant(request.instance, request.fleet, request.holder, str(lease), now, request.ttl)
                return AcquireResult(grant, Decision.allow("lock", f"slot taken in {self.describe()}"))
            self._revoke_quietly(lease)  # another agent wrote between our read and our commit: again
        raise CoordinatorUnavailable(
            f"{self.describe()}: lost the race for a restart slot {ATTEMPTS} times in a row; trying again later"
        )

    def renew(self, grant: Grant) -> float:
        """Extend the slot's lease by its TTL; returns the new expiry. `LeaseLost` if it is gone."""
        ttl = self.store.keepalive(int(grant.token))
        if ttl <= 0:
            raise LeaseLost(
                f"the restart slot of {grant.instance} in {self.describe()} expired before it was renewed; "
                "another agent may hold it now"
            )
        expires = self.clock() + ttl
        with self._lock:
            held = self._held.get(grant.token)
        if held is not None:
            key, record = held[0], {**held[1], "expires_at": expires}
            self.store.commit(slots.rewrite(key, record))
            with self._lock:
                self._held[grant.token] = (key, record)
        return expires

    def release(self, grant: Grant, outcome: str) -> None:
        """Free the slot and record how the restart ended (idempotent)."""
        with self._lock:
            held = self._held.get(grant.token)
        if held is not None and held[1].get("finished_at") is None:
            finished = {**held[1], "finished_at": self.clock(), "outcome": outcome}
            self.store.commit(slots.rewrite(held[0], finished))
        self.store.revoke(int(grant.token))
        with self._lock:
            self._held.pop(grant.token, None)

    def restarts(self, since: float) -> list[RestartRecord]:
        """Restarts in flight, and those started or finished at or after `since`, oldest first."""
        return slots.records(self.store.read(slots.HISTORY), since)

    def _revoke_quietly(self, lease: int) -> None:
        try:
            self.store.revoke(lease)
        except CoordinatorError:
            pass  # it expires by itself

    # ----------------------------------------------------------------------------- fleet view
    def publish(self, agent: str, entries: Sequence[FleetEntry], ttl: float) -> None:
        """Replace what `agent` published with `entries`; they expire `ttl` seconds after the last
        publish. Writes what changed; otherwise keeps the lease alive, every third of `ttl`."""
        with self._lock:
            lease, renewed, published = self._fleet_lease, self._fleet_renewed, dict(self._published)
        now = time.monotonic()
        if lease and now - renewed >= ttl / 3:
            if self.store.keepalive(lease) > 0:
                renewed = now
            else:
                lease = 0  # expired: every entry went with it
        if not lease:
            lease, renewed, published = self.store.grant(ttl), now, {}
        change, wanted = fleet_entries.publish(published, entries, lease)
        try:
            for part in chunks(change, self.store.max_ops) if change.size else ():
                self.store.commit(part)
        except CoordinatorError:
            wanted = {}  # unsure what was written: everything is written again next time
            raise
        finally:
            with self._lock:
                self._fleet_lease, self._fleet_renewed, self._published = lease, renewed, wanted

    def fleet(self) -> list[FleetEntry]:
        """Every agent's published entries that have not expired, by instance name (the leader's
        from a copy the store keeps current)."""
        snapshot = self.store.read([fleet_entries.FLEET], watch=self._leadership is not None)
        found, self._parsed = fleet_entries.entries(snapshot, self._parsed)
        return found

    # ----------------------------------------------------------------------------- the elected planner
    def campaign(self, agent: str, ttl: float, spread: float = 0.0) -> Leadership | None:
        """Become or stay the namespace's leader for `ttl` seconds; None while another agent is.
        `spread`: a vacant seat is claimed up to this many seconds late (`seat.claim_due`)."""
        snapshot = self.store.read([controls.CONTROL], recent=True)
        now = time.monotonic()
        mine = self._leadership
        if mine is not None:
            if snapshot.revision >= mine.revision and not seat.fenced_by(snapshot, mine.revision):
                self._step_down()
            elif now - self._leader_renewed >= ttl / 3:
                if self.store.keepalive(self._leader_lease) > 0:
                    self._leader_renewed = now
                else:
                    self._step_down()
            if self._leadership is not None:
                return self._leadership
        if snapshot.get(seat.LEADER) is not None:
            self._vacant_since = None
            return None
        if self._vacant_since is None:
            self._vacant_since = now
        if not seat.claim_due(agent, now - self._vacant_since, spread):
            return None  # an agent earlier in the hash order claims it first
        lease = self.store.grant(ttl)
        try:
            revision = self.store.commit(seat.claim(agent, self.clock(), lease))
        except CoordinatorError:
            self._revoke_quietly(lease)
            raise
        if revision is None:
            self._revoke_quietly(lease)
            return None
        leadership = Leadership(agent, revision, self.clock())
        written = seat.grants_in(self.store.read([seat.GRANTS]))
        self.store.read([fleet_entries.FLEET], watch=True)  # the leader follows the fleet from now on
        with self._lock:
            self._leadership, self._leader_lease, self._leader_renewed = leadership, lease, now
            self._written, self._vacant_since = written, None
        return leadership

    def _step_down(self) -> None:
        with self._lock:
            self._leadership, self._written = None, {}
        self.store.unwatch(fleet_entries.FLEET)

    def resign(self) -> None:
        """Give up leadership at once (a clean shutdown), so a successor need not wait for the TTL."""
        lease = self._leader_lease if self._leadership is not None else 0
        self._step_down()
        if lease:
            self._revoke_quietly(lease)

    def leader(self) -> str | None:
        """The current leader's agent id, or None while the seat is vacant."""
        info = self.leader_info()
        return info["agent"] if info else None

    def leader_info(self) -> dict[str, Any] | None:
        """The current leader as `{agent, revision, since}`, or None while the seat is vacant."""
        return seat.leader_of(self.store.read([controls.CONTROL], recent=True))

    def write_grants(self, leadership: Leadership, grants: Mapping[str, Sequence[PlannedGrant]]) -> int:
        """Replace every agent's grants with `grants` (agent -> its grants), fenced by `leadership`;
        agents left out have none. Writes only what changed; returns how many agents' grants were
        written. `LeaseLost` when `leadership` no longer holds (nothing more is written then)."""
        with self._lock:
            written = dict(self._written)
        docs = seat.grant_docs(grants)
        change = seat.grants_change(written, docs, leadership.revision)
        for part in chunks(change, self.store.max_ops - 1) if change.size else ():
            if self.store.commit(part) is None:
                self._step_down()
                raise LeaseLost(
                    f"{self.describe()}: leadership (revision {leadership.revision}) was lost before "
                    "the grants were written; the new leader plans"
                )
        with self._lock:
            self._written = docs
        return change.size

    def grants(self, agent: str) -> list[PlannedGrant] | None:
        """`agent`'s grants from the current leader (none while the fleet is paused)."""
        snapshot = self.store.read([controls.CONTROL, seat.GRANTS + agent], recent=True)
        out = seat.grants_for(snapshot, agent, self.clock(), self.clocks)
        with self._lock:
            self._fences = {g.instance: g.revision for g in out}
        return out

    def _fence_for(self, instance: str) -> int | None:
        with self._lock:
            fence = self._fences.get(instance)
            if fence is None and self._leadership is not None:
                fence = self._leadership.revision
        return fence

    # ----------------------------------------------------------------------------- the fleet pause
    def fleet_pause(self) -> dict[str, Any] | None:
        """The fleet-wide pause in force (`read_pause`), or None: while it holds the leader grants
        nothing and `acquire` takes no slot; it ends by itself at its `until`."""
        snapshot = self.store.read([controls.CONTROL], recent=True)
        now = self.clock()
        lift = controls.lift_expired(snapshot, now, self.clocks)
        if lift is not None:
            try:
                self.store.commit(lift)
            except CoordinatorError:
                pass  # every reader reads it as over already; the next one deletes it
        return controls.pause_in(snapshot, now, self.clocks)

    def set_fleet_pause(self, pause: dict[str, Any] | None) -> None:
        """Set (a JSON object: reason, until, by, since, agent) or lift (None) the fleet-wide pause."""
        self.store.commit(controls.set_pause(pause))

    # ----------------------------------------------------------------------------- workload profiles
    def put_profile(self, key: str, doc: Mapping[str, Any], ttl: float) -> None:
        """Share `doc` (a JSON object of at most `MAX_PROFILE_BYTES`) as workload `key`'s profile,
        replacing the last one; it expires `ttl` seconds later unless put again. `CoordinatorError`
        for a bad key or doc (`profile_text`)."""
        profile_text(key, doc)  # refused before any request
        lease, held_ttl = self._profile_lease
        if not (lease and held_ttl == ttl and self.store.keepalive(lease) > 0):
            lease = self.store.grant(ttl)
            self._profile_lease = (lease, ttl)
        self.store.commit(profiles.put(key, doc, lease))

    def get_profiles(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The unexpired profiles of `keys` (at most `MAX_PROFILE_READ`), by key; a key with none,
        or with a doc that is not a JSON object, is left out."""
        wanted = profiles.wanted_keys(keys)
        return profiles.profiles_in(self.store.read(wanted)) if wanted else {}


__all__ = [  # what callers outside the coordinator take from here
    "EXPIRED",
    "MAX_PROFILE_READ",
    "Coordinator",
    "Grant",
    "Leadership",
    "PlannedGrant",
    "SlotRequest",
    "checked_time",
    "fleet_pause_decision",
    "pause_over",
    "read_pause",
    "shown_pause",
]
