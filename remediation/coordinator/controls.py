"""The fleet-wide pause, as a rule over a snapshot: the key `control/pause`, a JSON record.

While it holds, the leader grants nothing and no slot is taken. Its time is told by `read_pause`:
on the boot clock of the host that set it (`remediation.deadlines`, so moving the wall clock does
not end it), else on the wall clock. It hangs on no lease (a lease runs on a clock that a jump of
the wall clock moves, on the local store): the first agent that reads it past its end deletes it
(`lift_expired`), and until then every reader already reads it as over. A record that is no JSON
object within `MAX_PAUSE_BYTES` holds (fail closed) until lifted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent.core.figures import LATEST_TIME as LATEST  # a time past it in a record read back is no time
from agent.core.figures import is_number
from remediation.coordinator.records import json_object
from remediation.coordinator.store import Change, Put, Snapshot
from remediation.deadlines import Clocks, settle
from remediation.model import Decision
from remediation.text import at

CONTROL = "control/"
PAUSE = "control/pause"
MAX_PAUSE_BYTES = 4096  # a fleet pause record as JSON; a bigger one reads as unreadable (and holds)
UNREADABLE_PAUSE = "unreadable fleet pause record (lift it with `medic resume --fleet`)"


def read_pause(text: str | None, now: float, clocks: Clocks | None = None) -> dict[str, Any] | None:
    """The fleet pause that `text` (what the coordinator holds, or None) records, while it holds at
    `now`: one whose time is up holds no more; one that is no JSON object within `MAX_PAUSE_BYTES`
    holds (fail closed) and says it is unreadable. Fields come back checked: `reason` and
    `by`/`agent` text, `until`/`since` unix times or None, the anchor on the boot clock of the host
    that set it (`remediation.deadlines`); others are dropped. Its time is told by that boot clock
    on the same host (so moving the wall clock does not end it), else by the wall clock."""
    if text is None:
        return None
    value = json_object(text, MAX_PAUSE_BYTES)
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


# ----------------------------------------------------------------------------- over a snapshot
def pause_in(snapshot: Snapshot, now: float, clocks: Clocks) -> dict[str, Any] | None:
    """The fleet pause `snapshot` holds at `now`, or None."""
    return read_pause(snapshot.value(PAUSE), now, clocks)


def lift_expired(snapshot: Snapshot, now: float, clocks: Clocks) -> Change | None:
    """The delete of a pause whose time is up (None when there is none, or it still holds)."""
    if snapshot.get(PAUSE) is None or pause_in(snapshot, now, clocks) is not None:
        return None
    return Change(expect={PAUSE: snapshot.revision_of(PAUSE)}, deletes=[PAUSE])


def set_pause(pause: Mapping[str, Any] | None) -> Change:
    """Set (a JSON object: reason, until, by, since, agent, and its boot anchor) or lift (None) it."""
    if pause is None:
        return Change(deletes=[PAUSE])
    return Change(puts={PAUSE: Put(json.dumps(dict(pause)))})
