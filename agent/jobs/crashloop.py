"""Crash loops as findings of their own (`kind: crash-loop`), whatever else is found or not.

Judged every remediation step from the tracker's record of every process of every instance
(`Tracker.runs`: the supervisor's own starts and exits for managed commands) with real uptimes:
`crash_loop.max_restarts` processes that ended before living `crash_loop.reset_after`, within
`crash_loop.window`, none of them up that long since. Counting starts afresh when a person clears
the instance's escalation or it expires (`Ledger.reset_at`). The finding goes through the detection
job's findings table and `finding_*` events (`Detection.put_finding`); the remediation ladder
escalates it, and the escalation holds the supervisor's relaunches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from agent.core.types import Kind
from agent.detect.model import Finding, Transition
from agent.jobs.detection import Detection
from agent.watch.tracker import Tracker
from remediation.config import CrashLoopSection
from remediation.model import Lifetime
from remediation.policy import crash_loop_run
from remediation.text import span

KIND: Kind = "crash-loop"
SHOWN_RUNS = 50  # the evidence lists at most this many processes


class CrashLoops:
    def __init__(
        self,
        tracker: Tracker,
        detection: Detection,
        settings: CrashLoopSection,
        reset_at: Callable[[str], float | None],
    ) -> None:
        self.tracker = tracker
        self.detection = detection
        self.settings = settings
        self.reset_at = reset_at

    def check(self, now: float) -> list[Transition]:
        """Open, or resolve, each instance's crash-loop finding; returns what changed."""
        with self.tracker.lock:
            names = sorted(self.tracker.states)
        changes = []
        for name in names:
            change = self._judge(name, now)
            if change is not None:
                self.detection.put_finding(change)
                changes.append(change)
        return changes

    def lifetimes(self, name: str, now: float) -> list[Lifetime]:
        """The processes that count for `name` now (started after its last clear or expiry)."""
        since = max(now - self.settings.window, self.reset_at(name) or -math.inf)
        return [
            Lifetime(run.started_at, run.ended_at, run.exit_status, run.pid)
            for run in self.tracker.runs(name, since)
            if run.started_at > since
        ]

    def _judge(self, name: str, now: float) -> Transition | None:
        s = self.settings
        crashed = crash_loop_run(self.lifetimes(name, now), now, s.window, s.reset_after)
        current = next(
            (f for f in self.detection.active if f.kind == KIND and f.instance == name and f.state == "open"),
            None,
        )
        if len(crashed) >= s.max_restarts and current is None:
            return Transition("opened", self._finding(name, crashed, now), now, "")
        if len(crashed) < s.max_restarts and current is not None:
            current.state, current.resolved_at, current.updated_at = "resolved", now, now
            reset = self.reset_at(name)
            why = (
                "its escalation was cleared or expired: counting starts afresh"
                if reset is not None and reset >= (current.opened_at or 0)
                else f"fewer than {s.max_restarts} crashes within {span(s.window)} now"
            )
            return Transition("resolved", current, now, why)
        return None

    def _finding(self, name: str, crashed: list[Lifetime], now: float) -> Finding:
        s = self.settings
        longest = max(lt.uptime(now) for lt in crashed)
        statuses = sorted({lt.exit_status for lt in crashed if lt.exit_status is not None})
        summary = (
            f"{name} crashed {len(crashed)} times within {span(s.window)}; the longest-lived process "
            f"stayed up {span(longest)} (a run ends at {span(s.reset_after)} up)"
            + (f"; exit status {', '.join(map(str, statuses))}" if statuses else "")
        )
        evidence: dict[str, Any] = {
            "crashes": len(crashed),
            "window_seconds": s.window,
            "reset_after_seconds": s.reset_after,
            "max_restarts": s.max_restarts,
            "longest_uptime_seconds": round(longest, 3),
            "runs": [
                {
                    "pid": lt.pid,
                    "started_at": lt.start,
                    "ended_at": lt.end,
                    "uptime_seconds": round(lt.uptime(now), 3),
                    "exit_status": lt.exit_status,
                }
                for lt in crashed[-SHOWN_RUNS:]
            ],
        }
        first = crashed[0].start
        return Finding(
            id=f"{name}:{KIND}:{int(first)}",
            instance=name,
            kind=KIND,
            severity="critical",
            state="open",
            first_seen=now,
            opened_at=now,
            updated_at=now,
            resolved_at=None,
            summary=summary,
            verdict=None,
            evidence=evidence,
            lifetime_start=crashed[-1].start,
        )
