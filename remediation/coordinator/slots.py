"""Restart slots and their history, as rules over a snapshot of the store.

    slots/<instance>          the restart in flight, on its holder's lease: a holder that dies
                              stops keeping it alive and the slot goes with the lease
    restarts/<ms>-<instance>  the restart's record (no lease, pruned after the retention), put
                              again with its expiry at each renewal and with its outcome at release
    clock                     rewritten by every acquisition

An acquisition reads these and `control/` in one snapshot, and commits only if `clock`, the
instance's slot (absent), the pause and, under a grant, the leader's seat are as it read them: two
agents racing for the last slot both expect the same `clock`, so at most one commits, and the other
reads again and asks the budget again. A record whose slot is gone (or another restart's) is one
that ended when its lease did: finished at its last `expires_at`, outcome `lease-expired`. Releases
and expiries only free capacity, so a view they make stale is never too generous.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from remediation.coordinator.controls import PAUSE, fleet_pause_decision, pause_in
from remediation.coordinator.records import EXPIRED, SlotRequest, json_object
from remediation.coordinator.seat import LEADER, fenced_by, stale_grant
from remediation.coordinator.store import ABSENT, Change, Put, Snapshot
from remediation.deadlines import Clocks
from remediation.model import Decision, RestartRecord

SLOTS = "slots/"
RESTARTS = "restarts/"
CLOCK = "clock"
HISTORY = (SLOTS, RESTARTS)
ACQUIRE = (CLOCK, SLOTS, RESTARTS, "control/")
MAX_RECORD_BYTES = 4096


def _slots(snapshot: Snapshot) -> dict[str, dict[str, Any]]:
    return {
        name: value
        for name, item in snapshot.under(SLOTS).items()
        if (value := json_object(item.value, MAX_RECORD_BYTES)) is not None
    }


def _raw(snapshot: Snapshot) -> list[tuple[str, dict[str, Any]]]:
    """Each record with its key, as written, except that one whose slot is gone ended with its lease."""
    slots = _slots(snapshot)
    out = []
    for name, item in snapshot.under(RESTARTS).items():
        value = json_object(item.value, MAX_RECORD_BYTES)
        if value is None:
            continue  # a bad record of another agent must not block every restart
        instance = value.get("instance")
        if value.get("finished_at") is None:
            slot = slots.get(instance) if isinstance(instance, str) else None
            if slot is None or slot.get("token") != value.get("token"):
                value = {**value, "finished_at": value.get("expires_at"), "outcome": EXPIRED}
        out.append((RESTARTS + name, value))
    return out


def records(snapshot: Snapshot, since: float) -> list[RestartRecord]:
    """Restarts in flight, and those started or finished at or after `since`, oldest first."""
    out = []
    for _, value in _raw(snapshot):
        try:
            record = RestartRecord.from_dict(value)
        except ValueError:
            continue
        if record.finished_at is None or record.finished_at >= since or record.started_at >= since:
            out.append(record)
    out.sort(key=lambda r: (r.started_at, r.instance))
    return out


def expired(snapshot: Snapshot, now: float, retention: float) -> list[str]:
    """The keys of records finished and started longer than `retention` ago."""
    cutoff = now - retention
    old = []
    for key, value in _raw(snapshot):
        finished, started = value.get("finished_at"), value.get("started_at")
        if all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v < cutoff
            for v in (finished, started)
        ):
            old.append(key)
    return old


def refusal(
    snapshot: Snapshot, request: SlotRequest, now: float, clocks: Clocks, fence: int | None
) -> Decision | None:
    """Why `request` cannot take its slot whatever the budget says, or None."""
    slot = _slots(snapshot).get(request.instance)
    if slot is not None or snapshot.get(SLOTS + request.instance) is not None:
        holder = (slot or {}).get("holder")
        return Decision.block(
            "lock",
            "in-flight",
            f"{request.instance} is already being restarted by {holder if isinstance(holder, str) else 'another agent'}",
        )
    pause = pause_in(snapshot, now, clocks)
    if pause is not None:
        return fleet_pause_decision(pause)
    if fence is not None and not fenced_by(snapshot, fence):
        return stale_grant(request.instance, fence)
    return None


def acquisition(
    snapshot: Snapshot,
    request: SlotRequest,
    now: float,
    lease: int,
    *,
    fence: int | None,
    prune: list[str],
) -> tuple[Change, str, dict[str, Any]]:
    """The commit that takes the slot on `lease` (and prunes `prune`), the record's key and the record."""
    token = str(lease)
    key = f"{RESTARTS}{int(now * 1000):016d}-{request.instance}"
    record = {
        "instance": request.instance,
        "fleet": request.fleet,
        "holder": request.holder,
        "started_at": now,
        "expires_at": now + request.ttl,
        "finished_at": None,
        "outcome": None,
        "token": token,
    }
    expect = {
        CLOCK: snapshot.revision_of(CLOCK),
        SLOTS + request.instance: ABSENT,
        PAUSE: snapshot.revision_of(PAUSE),
    }
    if fence is not None:
        expect[LEADER] = fence
    puts = {
        SLOTS + request.instance: Put(
            json.dumps({"token": token, "holder": request.holder, "started_at": now}), lease
        ),
        key: Put(json.dumps(record)),
        CLOCK: Put(json.dumps({"last": now, "by": request.holder})),
    }
    return Change(expect, puts, prune), key, record


def rewrite(key: str, record: Mapping[str, Any]) -> Change:
    """The record put again (its expiry renewed, or its outcome)."""
    return Change(puts={key: Put(json.dumps(dict(record)))})
