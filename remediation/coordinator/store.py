"""The lease store every coordinator stands on: five operations, and the fleet's rules on top.

    read(keys)       a snapshot of keys (a key ending in "/" is a prefix) with their revisions
    commit(change)   puts and deletes, all or nothing, if the revisions it expects still hold
    grant(ttl)       a lease: keys put on it are deleted when it runs out or is revoked
    keepalive(lease) the lease's TTL again; 0 when it is gone
    revoke(lease)    end the lease now (its keys go with it)

Two stores implement it: SQLite (`sqlite_store.py`, one `BEGIN IMMEDIATE` transaction per commit,
for the agents of one host) and etcd (`etcd_store.py`, a txn whose compares are the expected
revisions). What a slot, a leader, a grant, a fleet pause or a workload profile is, is written once
over a `Snapshot` in the rules modules (`slots.py`, `seat.py`, `controls.py`, `profiles.py`,
`fleet_entries.py`) and composed in `base.Coordinator`.

Revisions are the store's: every commit that writes gets the next one, a key keeps the revision it
was created at (`created`) and the one it was last written at (`revision`); 0 means absent. A key
that is never rewritten after its creation (the leader's seat) has both equal, so either fences.
Every operation raises `CoordinatorUnavailable` when the store does not answer in time and
`CoordinatorError` when its answer cannot be read: no restart, and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

ABSENT = 0  # the revision `Change.expect` gives a key that must not exist


@dataclass(frozen=True, slots=True)
class Item:
    value: str
    revision: int  # the revision of its last write
    created: int  # the revision it was created at
    lease: int = 0  # the lease it hangs on; 0: none


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one read saw, keys relative to the namespace."""

    items: Mapping[str, Item]
    revision: int = 0  # the store's revision at the read (0: unknown, e.g. served from watches)

    def get(self, key: str) -> Item | None:
        return self.items.get(key)

    def value(self, key: str) -> str | None:
        item = self.items.get(key)
        return item.value if item is not None else None

    def revision_of(self, key: str) -> int:
        """The key's last write, or `ABSENT`: what a `Change` expects to keep it unchanged."""
        item = self.items.get(key)
        return item.revision if item is not None else ABSENT

    def under(self, prefix: str) -> dict[str, Item]:
        """The items under `prefix`, by the rest of their key."""
        return {k[len(prefix) :]: v for k, v in self.items.items() if k.startswith(prefix)}


@dataclass(frozen=True, slots=True)
class Put:
    value: str
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Change:
    """What one commit writes, and the revisions (`ABSENT` for none) it requires to still hold."""

    expect: Mapping[str, int] = field(default_factory=dict)
    puts: Mapping[str, Put] = field(default_factory=dict)
    deletes: Sequence[str] = ()

    @property
    def size(self) -> int:
        return len(self.puts) + len(self.deletes)


class LeaseStore(Protocol):
    max_ops: int  # puts and deletes one commit may carry (etcd: its --max-txn-ops, less headroom)

    def read(self, keys: Sequence[str], *, watch: bool = False, recent: bool = False) -> Snapshot:
        """The keys (those ending in "/" as prefixes) in one consistent read. `watch`: the store may
        answer from a copy it keeps current (etcd: a watch stream; no request while nothing changes).
        `recent`: from a copy read an instant ago (etcd: within a second; one request a step)."""
        ...

    def commit(self, change: Change) -> int | None:
        """Apply `change` if every expected revision holds: the new revision, else None (nothing written)."""
        ...

    def grant(self, ttl: float) -> int: ...

    def keepalive(self, lease: int) -> float: ...

    def revoke(self, lease: int) -> None: ...

    def unwatch(self, key: str) -> None:
        """Stop keeping `key` current (the store forgets the copy `read(watch=True)` made)."""
        ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


def chunks(change: Change, size: int) -> list[Change]:
    """`change` split into commits of at most `size` puts and deletes, each with its expectations."""
    ops: list[tuple[str, Put | None]] = [(k, None) for k in change.deletes]
    ops += list(change.puts.items())
    if not ops:
        return [change]
    out = []
    for start in range(0, len(ops), max(size, 1)):
        part = ops[start : start + size]
        puts = {k: p for k, p in part if p is not None}
        out.append(Change(change.expect, puts, [k for k, p in part if p is None]))
    return out
