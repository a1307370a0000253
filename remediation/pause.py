"""The pause (the kill switch): nothing is purged or restarted until it expires or is lifted.

It lives in memory first: `pause()` takes effect at once, for the next gate and for every request
submitted after it, even when the ledger cannot be written (disk full); storing it is retried at
the start of every step until it succeeds (`retry()`), and `storage()` says whether it is stored
yet. `resume()` and an expiry work the same way.

Its expiry is kept on the boot clock as well as the wall clock (`remediation.deadlines`): moving the
wall clock, while the agent runs or while it is stopped, neither ends a pause nor stretches it.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
from collections.abc import Callable, Mapping
from typing import Any

from agent.core.errors import StoreError
from agent.core.ports import EventSink
from remediation.deadlines import Clocks, anchored, settle
from remediation.ledger import Ledger
from remediation.model import Decision
from remediation.text import at

log = logging.getLogger("medic.remediation")
_STORE_ERRORS = (sqlite3.Error, StoreError, OSError)


class KillSwitch:
    def __init__(
        self, ledger: Ledger, events: EventSink, clock: Callable[[], float], clocks: Clocks | None = None
    ) -> None:
        self.ledger = ledger
        self.events = events
        self.clock = clock
        self.clocks = clocks or Clocks.for_wall(clock)
        self._lock = threading.Lock()  # never held while a step runs: a pause never waits
        self._pause: dict[str, Any] | None = ledger.pause()
        self._unsaved: str | None = None  # why the in-memory state is not in the ledger yet

    def pause(self, reason: str, until: float, by: str | None = None) -> dict[str, Any]:
        """Hold every action until `until` (unix time) or `resume()`; ValueError without a reason or a
        future expiry."""
        now = self.clock()
        if not reason or not reason.strip():
            raise ValueError("a pause needs a reason (who is doing what, for how long)")
        if not math.isfinite(until) or until <= now:
            raise ValueError("a pause needs an expiry in the future")
        value: dict[str, Any] = {"reason": reason.strip(), "until": until, "by": by, "since": now}
        with self._lock:
            self._pause = anchored(value, now, self.clocks)
            stored = self._save()
        self.events.emit(
            "remediation_paused",
            f"remediation paused until {at(until)} by {by or 'an operator'}: {reason}"
            + ("" if stored else " (held in memory: the state database cannot be written yet)"),
            severity="warning",
            persisted=stored,
            **value,
        )
        return dict(value)

    def resume(self, by: str | None = None) -> dict[str, Any] | None:
        """Lift the pause; returns the one lifted, or None when there was none."""
        with self._lock:
            previous, self._pause = self._pause, None
            stored = self._save() if previous is not None or self._unsaved else True
            previous = None if previous is None else self._public(previous)
        if previous is not None:
            self.events.emit(
                "remediation_resumed",
                f"remediation resumed by {by or 'an operator'}"
                + ("" if stored else " (in memory: the state database cannot be written yet)"),
                by=by,
                persisted=stored,
            )
        return previous

    def paused(self, now: float) -> dict[str, Any] | None:
        """The pause in force at `now` (from memory: no store read); an expired one is lifted. Its
        time is told by the boot clock: a wall clock moved since it was set moves its `until` along
        (stored again), instead of ending it or stretching it."""
        with self._lock:
            if self._pause is None:
                return None
            pause, moved = settle(self._pause, now, self.clocks)
            if pause["until"] > now:
                if moved:
                    self._pause = pause
                    self._save()
                return self._public(pause)
            self._pause = None
            self._save()
        public = self._public(pause)
        self.events.emit("remediation_resumed", f"the pause ({pause['reason']}) expired", **public)
        return None

    @staticmethod
    def _public(pause: dict[str, Any]) -> dict[str, Any]:
        """What people and the API see of a pause: its anchor on the boot clock is bookkeeping."""
        return {k: v for k, v in pause.items() if k not in ("boot_id", "boot_until")}

    def storage(self) -> dict[str, Any]:
        """`{"persisted": True}`, or False with a warning that says what holds and what is retried."""
        with self._lock:
            error, pause = self._unsaved, self._pause
        if error is None:
            return {"persisted": True}
        what = "the pause" if pause is not None else "the resume"
        lost = "forgets the pause" if pause is not None else "brings the old pause back"
        return {
            "persisted": False,
            "warning": f"{what} could not be stored ({error}; disk full?): {what} holds in memory now "
            f"and storing it is retried on every remediation step; an agent restart before then {lost}",
        }

    def retry(self) -> None:
        """Store a pause (or resume) that could not be written before; says so once it is."""
        with self._lock:
            if self._unsaved is None or not self._save():
                return
            pause = self._pause
        self.events.emit(
            "remediation_pause_stored",
            "the pause is now stored in the state database"
            if pause is not None
            else "the resume is now stored in the state database",
            paused=pause is not None,
        )

    def _save(self) -> bool:
        """Write the in-memory pause (or its absence) to the ledger; called with `_lock` held."""
        try:
            if self._pause is None:
                self.ledger.clear_pause()
            else:
                p = self._pause
                anchor = {"boot_id": p.get("boot_id"), "boot_until": p.get("boot_until")}
                self.ledger.set_pause(p["reason"], p["until"], p["by"], p["since"], anchor)
        except _STORE_ERRORS as exc:
            if self._unsaved is None:
                log.error("the pause state cannot be stored (%s); it holds in memory, retried each step", exc)
            self._unsaved = str(exc)
            return False
        self._unsaved = None
        return True


def pause_decision(pause: Mapping[str, Any]) -> Decision:
    """The verdict on an instance while `pause` holds."""
    who = pause.get("by") or "an operator"
    return Decision.block(
        "pause",
        "paused",
        f"remediation paused by {who} until {at(pause['until'])}: {pause['reason']}",
        pause["until"],
    )
