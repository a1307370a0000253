"""The peers job: workload profiles shared between agents through the remediation coordinator.

A new pod starts with an empty store, but its fleet's other agents have learned the workload's
daily profile, level and warm-up (`agent.detect.memory.priors`). At start, and every `read_every`
(3 h), this job reads the profiles of the workload keys this agent watches (one request for all of
them) and offers each to the detection job's priors as the source `peers`; a doc a peer garbled
(`WorkloadProfile.from_dict` refuses it) is skipped and logged. It publishes this agent's own
learned profiles (`Detection.shared_profiles`) when they changed, and again before their lease
(`ttl`, 12 h) runs out, at most once per `publish_every` (1 h). So the load on the coordinator is a
few requests per agent per hour, whatever the size of the fleet.

It fails closed and quiet: an unreachable coordinator, or an answer it cannot read (a `CoordinatorError`,
never "0 profiles"), means no peer priors (any it gave before
are dropped), said once in a `peers_unavailable` event until a read works again; never a raise.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from typing import Any

from agent.detect.seasonal import WorkloadProfile
from agent.jobs.detection import Detection
from agent.jobs.streak import FailureStreak
from agent.state.eventlog import EventLog
from remediation.coordinator.base import MAX_PROFILE_READ, Coordinator
from remediation.errors import CoordinatorError

log = logging.getLogger("medic.peers")
SOURCE = "peers"
TICK = 5.0  # how often the scheduler asks whether a read or a publish is due (a comparison: cheap)
READ_EVERY = 3 * 3600.0
PUBLISH_EVERY = 3600.0
TTL = 12 * 3600.0  # a published profile outlives its agent by this much at most
RETRY = 600.0  # after a failed read


class PeersJob:
    """Reads the fleet's profiles into `detection.priors`, publishes this agent's own."""

    def __init__(
        self,
        coordinator: Coordinator,
        detection: Detection,
        events: EventLog,
        agent: str,
        *,
        read_every: float = READ_EVERY,
        publish_every: float = PUBLISH_EVERY,
        ttl: float = TTL,
    ) -> None:
        self.coordinator = coordinator
        self.detection = detection
        self.events = events
        self.agent = agent  # stamped on what it publishes, so it never reads its own back as a peer's
        self.read_every = read_every
        self.publish_every = publish_every
        self.ttl = ttl
        self._lock = threading.Lock()
        self._streak = FailureStreak()
        self._read_due = -math.inf
        self._read_keys: set[str] = set()
        self._offered: set[str] = set()
        self._publish_due = -math.inf
        self._published: dict[str, tuple[str, float]] = {}  # key -> (doc as JSON, when put)

    def tick(self, now: float | None = None) -> None:
        """Called every `TICK`: reads when due (or when a workload appears), publishes when due."""
        now = time.time() if now is None else now
        with self._lock:
            keys = set(self.detection.workload_keys())
            if now >= self._read_due or not keys <= self._read_keys:
                self._read(sorted(keys), now)
            if now >= self._publish_due:
                self._publish(now)

    # ------------------------------------------------------------------------------ reading
    def _read(self, keys: list[str], now: float) -> None:
        try:
            docs: dict[str, dict[str, Any]] = {}
            for start in range(0, len(keys), MAX_PROFILE_READ):
                docs |= self.coordinator.get_profiles(keys[start : start + MAX_PROFILE_READ])
        except CoordinatorError as exc:
            self._unavailable(str(exc), now)
            return
        except Exception as exc:  # a bug must not stop the agent: it is only a prior
            log.exception("reading the peers' profiles failed")
            self._unavailable(f"{exc.__class__.__name__}: {exc}", now)
            return
        loaded = set()
        for key, doc in docs.items():
            if doc.get("by") == self.agent:
                continue  # this agent's own, already in its priors as `own`
            try:
                profile = WorkloadProfile.from_dict(doc)
            except ValueError as exc:
                log.warning("the peers' profile of workload %s is skipped: %s", key, exc)
                continue
            self.detection.priors.offer(key, SOURCE, profile)
            loaded.add(key)
        for key in self._offered - loaded:
            self.detection.priors.offer(key, SOURCE, None)
        recovered = self._streak.succeeded()  # the first read, or the first since a failing streak
        if recovered or loaded != self._offered:
            self.events.emit(
                "priors_loaded",
                f"peers' profiles for {len(loaded)} of {len(keys)} workloads from "
                f"{self.coordinator.describe()}" + (f": {', '.join(sorted(loaded)[:20])}" if loaded else ""),
                severity="info",
                source=SOURCE,
                workloads=sorted(loaded)[:100],
            )
        self._offered, self._read_keys = loaded, set(keys)
        self._read_due = now + self.read_every

    def _unavailable(self, reason: str, now: float) -> None:
        """No peer priors: drop what they gave, and say so once per failing streak."""
        for key in self._offered:
            self.detection.priors.offer(key, SOURCE, None)
        self._offered = set()
        if self._streak.failed():
            self.events.emit(
                "peers_unavailable",
                f"no workload profiles from peers: {reason}; detectors go on without them "
                f"(tried again in {min(RETRY, self.read_every) / 60:g} min)",
                severity="warning",
            )
        self._read_due = now + min(RETRY, self.read_every)

    # ------------------------------------------------------------------------------ publishing
    def _publish(self, now: float) -> None:
        """Put the profiles that changed or whose lease is half gone; after a put, the next one is
        an hour on (until something is to be put, each tick only compares)."""
        try:
            shared = self.detection.shared_profiles()
        except Exception:
            log.exception("cannot gather this agent's workload profiles")
            self._publish_due = now + self.publish_every
            return
        for key, doc in sorted(shared.items()):
            text = json.dumps(doc, sort_keys=True)
            last = self._published.get(key)
            if last is not None and last[0] == text and now - last[1] < self.ttl / 2:
                continue
            self._publish_due = now + self.publish_every
            try:
                self.coordinator.put_profile(key, {**doc, "by": self.agent}, self.ttl)
            except CoordinatorError as exc:
                log.warning("the profile of workload %s was not shared: %s", key, exc)
                continue  # unreachable is said by the reads; tried again at the next publish
            self._published[key] = (text, now)
