"""How long safety state lasts (a pause), on a clock that moving the wall clock does not move.

A pause keeps its expiry as a wall time, `until`: it is what people read, and the only time that
survives a reboot. Alone, it ends at once when someone moves the wall clock 400 days forward (by
hand, or NTP stepping the clock of a VM that resumed), and lasts 400 days more when it is moved
back. So the record also carries the boot it was set in (`boot_id`, from the kernel, new at every
boot) and its end on that boot's `CLOCK_BOOTTIME` (`boot_until`: seconds since the boot, suspend
included, never stepped; shared by every process of the host, so it survives an agent restart):

- in the boot it was set in, `boot_until` decides: a jump of the wall clock changes nothing, and
  `until` is moved along with the wall clock (the record is stored again), so that it stays right
  for the next reboot and reads right on the dashboard;
- after a reboot, the wall clock decides, for at most the length the state was set for (`until -
  since`: a clock that comes up years behind does not hold a 1 h pause for years), and the rest is
  anchored on the new boot. A wall clock moved forward while the host was down ends it: nothing
  else survives a reboot to tell.

`Clocks` is injected (the engine's wall clock, the boot clock, the boot id) so that tests move them.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from probes.linux.procfs import read_boot_id

JUMP = 2.0  # seconds the two clocks may drift apart before `until` is moved (NTP slews far less)
_RUN_ID = f"run-{uuid.uuid4()}"  # where no boot id can be read: anchors hold for this run


def boot_seconds() -> float:
    """Seconds since boot, suspend included; never stepped."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):  # not Linux: the monotonic clock, also since boot
        return time.monotonic()


def this_boot() -> str:
    return read_boot_id() or _RUN_ID


@dataclass(frozen=True, slots=True)
class Clocks:
    """`boot` None: no boot clock, the wall clock alone tells (a part whose time a test drives)."""

    wall: Callable[[], float] = time.time
    boot: Callable[[], float] | None = boot_seconds
    boot_id: Callable[[], str] = field(default=this_boot)

    @classmethod
    def for_wall(cls, clock: Callable[[], float]) -> Clocks:
        """The clocks of a part given a wall `clock`: the host's, for the real wall clock; none
        but that clock for one a test drives (moving it is time passing). A test of a jump gives
        `Clocks` whose wall and boot clocks it moves apart."""
        if clock is time.time:
            return cls()
        return cls(wall=clock, boot=None)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def anchored(record: Mapping[str, Any], now: float, clocks: Clocks) -> dict[str, Any]:
    """`record` (a wall `until`, set at `now`) with its end on this boot's clock."""
    if clocks.boot is None:
        return dict(record)
    return {
        **record,
        "boot_id": clocks.boot_id(),
        "boot_until": clocks.boot() + (float(record["until"]) - now),
    }


def settle(record: Mapping[str, Any], now: float, clocks: Clocks) -> tuple[dict[str, Any], bool]:
    """`record` as it stands at `now` (the wall clock): its `until` (and `since`) on today's wall
    clock, anchored on this boot; and whether that changed (store it again). Its time is up when
    `until <= now`. A record without a finite `until` (held until lifted) is returned as it is."""
    boot = clocks.boot
    if not _number(record.get("until")) or boot is None:
        return dict(record), False
    until = float(record["until"])
    boot_id = clocks.boot_id()
    if record.get("boot_id") == boot_id and _number(record.get("boot_until")):
        left = float(record["boot_until"]) - boot()
        if abs(now + left - until) <= JUMP:
            return dict(record), False
        shift = now + left - until  # the wall clock moved: `until` and `since` move with it
        moved = {**record, "until": until + shift}
        if _number(record.get("since")):
            moved["since"] = record["since"] + shift
        return moved, True
    left = until - now  # another boot, or no anchor yet: the wall clock, at most the length set
    since = float(record["since"]) if _number(record.get("since")) else None
    if since is not None and until > since:
        left = min(left, until - since)
    settled = {**record, "until": now + left, "boot_id": boot_id, "boot_until": boot() + left}
    if since is not None and left < until - since:
        settled["since"] = now + left - (until - since)
    return settled, True
