"""The elected planner's seat and its grants, as rules over a snapshot of the store.

    control/leader   the leader: `{agent, since}` on the leader's lease, created by a commit that
                     requires it absent and never written again, so its revision fences every grant
                     the leader writes (and a new leader's is always higher)
    grants/<agent>   the leader's grants for that agent's instances, written only when they change,
                     by commits that require the seat to still be the writer's

A grant counts only while its revision is the current seat's and no fleet pause holds; a slot taken
under a grant requires the seat unchanged in the same commit, so a grant from a deposed leader never
starts a restart. A vacant seat is claimed up to `spread` seconds late, in a per-agent hash order,
so a whole fleet does not campaign in the same instant after its leader died.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from remediation.coordinator.controls import checked_time, pause_in
from remediation.coordinator.records import PlannedGrant, json_object
from remediation.coordinator.store import ABSENT, Change, Put, Snapshot
from remediation.deadlines import Clocks
from remediation.model import Decision
from remediation.planner import stable_hash

LEADER = "control/leader"
GRANTS = "grants/"
MAX_GRANTS_BYTES = 1 << 20  # one agent's grants as JSON


def leader_of(snapshot: Snapshot) -> dict[str, Any] | None:
    """The seat as `{agent, revision, since}` (revision: its fencing revision), or None while vacant."""
    item = snapshot.get(LEADER)
    if item is None:
        return None
    value = json_object(item.value, 4096) or {}
    agent = value.get("agent")
    return {
        "agent": agent if isinstance(agent, str) else "?",
        "revision": item.created,
        "since": checked_time(value.get("since")),
    }


def fenced_by(snapshot: Snapshot, revision: int) -> bool:
    """Whether the seat is still the one of `revision`."""
    item = snapshot.get(LEADER)
    return item is not None and item.created == revision


def claim_due(agent: str, vacant_for: float, spread: float) -> bool:
    """Whether `agent` claims a seat vacant for `vacant_for` seconds (later ones wait for earlier ones)."""
    return spread <= 0 or vacant_for >= spread * (stable_hash(agent) % 1000) / 1000


def claim(agent: str, now: float, lease: int) -> Change:
    """The commit that takes the vacant seat on `lease`."""
    return Change(
        expect={LEADER: ABSENT}, puts={LEADER: Put(json.dumps({"agent": agent, "since": now}), lease)}
    )


def grant_docs(grants: Mapping[str, Sequence[PlannedGrant]]) -> dict[str, str]:
    """Each agent's grants as the text kept under `grants/<agent>` (agents without any: none)."""
    return {
        agent: json.dumps([g.to_dict() for g in sorted(items, key=lambda g: g.instance)], sort_keys=True)
        for agent, items in grants.items()
        if items
    }


def grants_change(written: Mapping[str, str], docs: Mapping[str, str], revision: int) -> Change:
    """What changed since `written`, fenced by the seat of `revision`."""
    puts = {GRANTS + a: Put(doc) for a, doc in docs.items() if written.get(a) != doc}
    return Change({LEADER: revision}, puts, [GRANTS + a for a in written if a not in docs])


def grants_in(snapshot: Snapshot) -> dict[str, str]:
    """Every agent's grants document, by agent."""
    return {agent: item.value for agent, item in snapshot.under(GRANTS).items()}


def grants_for(snapshot: Snapshot, agent: str, now: float, clocks: Clocks) -> list[PlannedGrant]:
    """`agent`'s grants that count: the current seat's, none while the fleet is paused."""
    seat = snapshot.get(LEADER)
    if seat is None or pause_in(snapshot, now, clocks) is not None:
        return []
    return [g for g in parse_grants(snapshot.value(GRANTS + agent) or "[]") if g.revision == seat.created]


def parse_grants(text: str) -> list[PlannedGrant]:
    """What a leader wrote; a bad grant is no grant (that instance waits)."""
    if len(text.encode()) > MAX_GRANTS_BYTES:
        return []
    try:
        items = json.loads(text)
    except (ValueError, RecursionError):
        return []
    out = []
    for item in items if isinstance(items, list) else []:
        try:
            out.append(PlannedGrant.from_dict(item))
        except ValueError:
            continue
    return out


def stale_grant(instance: str, revision: int) -> Decision:
    return Decision.block(
        "lock",
        "stale-grant",
        f"the grant for {instance} came from a leader that is no longer in charge (revision {revision}); "
        "waiting for the new leader's plan",
    )
