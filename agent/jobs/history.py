"""The history job: the workloads' past from Prometheus, at start and every `history.prometheus.refresh`.

A new pod starts with an empty store, and a new build is when leaks arrive: the history lets the
detectors judge its first hours with the workload's daily profile, level and warm-up
(`agent.detect.memory.priors`). `HistoryJob.run` never raises: an unreachable, slow or garbled
Prometheus, a bound passed, or an unreadable token file means "no history" (the priors it gave
before are dropped), said once in a `history_unavailable` event until a pull works again
(`history_loaded`). A failed pull is tried again after `RETRY`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from agent.config.history import PrometheusHistorySection
from agent.core.errors import MedicError
from agent.detect.memory.priors import PriorBook, learn_workload, workload_key
from agent.detect.model import InstanceSeries
from agent.detect.params import DetectParams
from agent.jobs.streak import FailureStreak
from agent.state.eventlog import EventLog

if TYPE_CHECKING:
    from agent.series.prometheus_pull import PullSpec

log = logging.getLogger(__name__)
SOURCE = "prometheus"
TICK = 5.0  # how often the scheduler asks whether a pull is due (a comparison: cheap)
RETRY = 600.0  # after a failed pull


def history_spec(section: PrometheusHistorySection, now: float) -> PullSpec:
    """The pull of the last `lookback` up to `now` (reads the token and TLS files: may raise)."""
    # the Prometheus reader loads only on an agent configured with `history:`, not on every agent
    from agent.series.prometheus_pull import PullSpec

    headers, context = section.credentials()
    return PullSpec(
        url=section.url,
        query=section.query,
        start=now - section.lookback,
        end=now,
        step=section.step,
        headers=headers,
        ssl_context=context,
        label=section.label,
        metric=section.metric,
        timeout=section.timeout,
        deadline=section.deadline,
        max_samples=section.max_samples,
        max_bytes=section.max_bytes,
        chunk_points=section.chunk_points,
    )


def pull_history(
    section: PrometheusHistorySection, now: float
) -> tuple[list[InstanceSeries], dict[str, dict[str, str]]]:
    """The instances' series over the lookback and each instance's labels; `MedicError` on failure."""
    from agent.series.prometheus_pull import pull_range

    result = pull_range(history_spec(section, now))
    return result.instances(), result.labels


class HistoryJob:
    """Pulls the history and offers each workload's profile to the agent's `PriorBook`."""

    def __init__(
        self,
        section: PrometheusHistorySection,
        events: EventLog,
        params: DetectParams,
        book: PriorBook,
        key_label: str = "fleet",
    ) -> None:
        self.section = section
        self.events = events
        self.params = params
        self.book = book
        self.key_label = key_label
        self._streak = FailureStreak()
        self._offered: set[str] = set()
        self._due = -math.inf
        self._lock = threading.Lock()

    def tick(self, now: float | None = None) -> None:
        """Called every `TICK` by the scheduler: pulls when one is due (at start, then every
        `refresh`; a failed pull is tried again after `RETRY`, or `refresh` if shorter)."""
        now = time.time() if now is None else now
        if now >= self._due:
            self.run(now)
            self._due = now + (
                self.section.refresh if self._streak.working else min(RETRY, self.section.refresh)
            )

    def run(self, now: float | None = None) -> int:
        """One pull; the number of workloads that got a profile (0 when there is no history)."""
        now = time.time() if now is None else now
        with self._lock:
            started = time.monotonic()
            try:
                instances, labels = pull_history(self.section, now)
            except MedicError as exc:
                self._unavailable(str(exc))
                return 0
            except Exception as exc:  # a bug must not stop the agent: it is only history
                log.exception("history pull failed")
                self._unavailable(f"{exc.__class__.__name__}: {exc}")
                return 0
            groups: dict[str, list[InstanceSeries]] = defaultdict(list)
            for series in instances:
                groups[workload_key(labels.get(series.instance, {}), series.instance, self.key_label)].append(
                    series
                )
            learned = set()
            for key, members in groups.items():
                profile = learn_workload(members, self.params, until=now)
                if profile is not None:
                    self.book.offer(key, SOURCE, profile)
                    learned.add(key)
            for key in self._offered - learned:
                self.book.offer(key, SOURCE, None)
            self._offered = learned
            samples = sum(len(points) for series in instances for points in series.series.values())
            message = (
                f"read {samples} samples of {len(instances)} instances from {self.section.url} in "
                f"{time.monotonic() - started:.1f}s: profiles for {len(learned)} of {len(groups)} workloads"
            )
            if self._streak.succeeded():
                self.events.emit("history_loaded", message, severity="info", workloads=sorted(learned)[:100])
            return len(learned)

    def _unavailable(self, reason: str) -> None:
        """No history: drop what it gave, and say so once per failing streak."""
        for key in self._offered:
            self.book.offer(key, SOURCE, None)
        self._offered = set()
        if self._streak.failed():
            self.events.emit(
                "history_unavailable",
                f"no history from Prometheus: {reason}; detectors start without its priors "
                f"(tried again in {min(RETRY, self.section.refresh) / 60:g} min)",
                severity="warning",
            )
