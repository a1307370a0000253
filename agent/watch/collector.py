"""Runs the enabled probes over every live instance and hands what they return to the store: samples
to `Store`, histogram snapshots to `HistogramStore`.

A probe that fails records an error (counter, last error) and, when its state changes, one
event; it never stops the tick nor the other probes; a snapshot that cannot be stored makes the
run a partial failure. Durations are measured in CPU time of the probing thread, so that a busy
host does not inflate them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent.core.errors import ProbeError, ProbeUnavailable, StoreError, TargetGone
from agent.core.records import Event, ProbeResult, ProbeTarget, ProcessIdentity, Sample
from agent.state.eventlog import EventLog
from agent.state.histograms import HistogramStore
from agent.state.store import Store
from agent.watch.ceilings import ceilings
from agent.watch.discovery import by_pid
from agent.watch.instances import InstanceState, ProbeHealth
from agent.watch.tracker import Tracker
from agent.watch.tree import CgroupOwnership, first_pss
from probes.base import Probe, Schedule

log = logging.getLogger("medic.collector")
KEEPALIVE = 60.0  # an unchanged value is stored again after this long, so flat series stay visible
SAMPLES_PER_BUCKET = 4  # ... and at least this often per detection bucket (short windows in tests, demos)
# a probe with no data for an instance (no hook, no latency source) is retried after half the time it
# has been without data, from 1 s up to this long: a short outage is noticed as soon as it ends
UNAVAILABLE_RETRY = 30.0
# a process younger than this may not have created its hook socket (or served its first /metrics) yet:
# "no data" then is not news, and the probe is simply tried again on the next tick
PROBE_GRACE = 15.0

# (probe name, wall seconds, ok) for each probe run; the exporter observes them
DurationObserver = Callable[[str, float, bool], None]


class Collector:
    def __init__(
        self,
        tracker: Tracker,
        store: Store,
        events: EventLog,
        probes: list[Probe],
        observe: DurationObserver | None = None,
        keepalive: float = KEEPALIVE,
        histograms: HistogramStore | None = None,
        grace: float = PROBE_GRACE,
    ) -> None:
        """`keepalive`: store an unchanged value again after this long (at most `KEEPALIVE`);
        `histograms`: where snapshots go (default: the histogram tables of `store`); `grace`: how long
        after a process started a probe without data for it stays quiet."""
        self.tracker = tracker
        self.store = store
        self.histograms = histograms or HistogramStore(store)
        self.events = events
        self.probes = probes
        self.observe = observe or (lambda name, seconds, ok: None)
        self.keepalive = keepalive
        self.grace = grace
        self._unavailable_since: dict[tuple[str, str], float] = {}  # (instance, probe) -> first miss
        # instance → metric → (value, ts); nested rather than keyed by pairs: a pair tuple per series
        # cost as much as the value it keys
        self._stored: dict[str, dict[str, tuple[float, float]]] = {}
        self.ownership = CgroupOwnership()
        tracker.forget_hooks.extend(probe.forget for probe in probes)
        tracker.forget_hooks.append(
            lambda target: self.ownership.forget(ProcessIdentity(target.pid, target.start_time))
        )
        tracker.forget_hooks.append(self._forget_stored)
        events.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        """A leak finding that opens, or a leak the type view cannot explain (`sites_requested`, from the
        detection job), asks the probes that can name allocation sites to start doing so."""
        finding = event.data.get("finding") if event.kind == "finding_opened" else None
        opened = isinstance(finding, dict) and finding.get("kind") == "leak"
        if not (opened or event.kind == "sites_requested") or not event.instance:
            return
        for probe in self.probes:
            want_sites = getattr(probe, "want_sites", None)
            if want_sites is not None:
                want_sites(event.instance)

    def run(self, schedule: Schedule, now: float | None = None) -> int:
        """One pass of the probes on `schedule` over all live instances; returns samples taken."""
        probes = [p for p in self.probes if p.schedule == schedule]
        taken = 0
        now_ = time.time() if now is None else now  # one timestamp per tick: series line up
        for state, target in self.tracker.up_targets():
            samples: list[Sample] = []
            processes: dict[ProcessIdentity, dict[str, float]] = {}
            notes: dict[str, str] = {}
            for probe in probes:
                result = self._run_probe(state, target, probe, now_)
                samples += result.samples
                if result.notes:
                    notes.update(result.notes)
                for identity, figures in result.processes.items():
                    known = processes.get(identity)
                    if known is None:
                        processes[identity] = dict(figures)
                    else:
                        known.update(figures)
            samples += self._tree_samples(state, target, schedule, processes, samples, now_)
            if schedule == "fast":
                samples.append(Sample(state.name, "process_start_time_seconds", now_, target.start_time))
                if state.memory_limit:
                    samples.append(Sample(state.name, "memory_limit_bytes", now_, state.memory_limit))
            with self.tracker.lock:
                if state.pid == target.pid:  # still the same process: publish
                    latest = state.latest
                    for sample in samples:
                        latest[sample.metric] = sample.value
                    if notes:
                        state.notes.update(notes)
                    if schedule == "fast" and "cpu_seconds_total" in latest:
                        state.observe_cpu(now_, latest["cpu_seconds_total"])
                    state.last_probe = now_
                    if schedule == "slow":
                        announce_ceilings(state, self.events)
            changed = self._worth_storing(state.name, samples)
            self.store.add_samples(changed)
            taken += len(changed)
        return taken

    def _worth_storing(self, instance: str, samples: list[Sample]) -> list[Sample]:
        """The samples whose value changed, or whose last stored value is older than `keepalive`."""
        stored = self._stored.get(instance)
        if stored is None:
            stored = self._stored[instance] = {}
        keepalive = self.keepalive
        changed = []
        for sample in samples:
            last = stored.get(sample.metric)
            if last is not None and last[0] == sample.value and sample.ts - last[1] < keepalive:
                continue
            stored[sample.metric] = (sample.value, sample.ts)
            changed.append(sample)
        return changed

    def _forget_stored(self, target: ProbeTarget) -> None:
        self._stored.pop(target.instance, None)
        for key in [k for k in self._unavailable_since if k[0] == target.instance]:
            del self._unavailable_since[key]

    def _tree_samples(
        self,
        state: InstanceState,
        target: ProbeTarget,
        schedule: Schedule,
        processes: dict[ProcessIdentity, dict[str, float]],
        samples: list[Sample],
        now: float,
    ) -> list[Sample]:
        """The instance's `tree_*` figures from its processes' (agent/watch/tree.py says which); the
        reads happen outside the tracker's lock."""
        with self.tracker.lock:
            if state.pid != target.pid:
                return []
            fresh = state.tree.unmeasured() if schedule == "fast" else []
            members = list(state.tree.members)
        if fresh:
            for identity, figures in first_pss(fresh).items():
                processes.setdefault(identity, {}).update(figures)
        working_set = next((s.value for s in samples if s.metric == "cgroup_memory_working_set_bytes"), None)
        server = ProcessIdentity(target.pid, target.start_time)
        owned = working_set is not None and self.ownership.owns(server, members, now)
        with self.tracker.lock:
            if state.pid != target.pid:
                return []
            state.tree.observe(now, processes)
            if schedule != "fast":
                return state.tree.pss_sample(state.name, now, processes)
            return state.tree.samples(state.name, now, working_set if owned else None)

    def _run_probe(self, state: InstanceState, target: ProbeTarget, probe: Probe, now: float) -> ProbeResult:
        health = state.probes.get(probe.name)
        if health is None:
            health = state.probes[probe.name] = ProbeHealth()
        elif health.unavailable is not None and now < health.retry_at:
            return ProbeResult()
        started = time.perf_counter()
        try:
            result = probe.collect(target, now)
        except TargetGone:
            return ProbeResult()  # the tracker records the disappearance on its next reconcile
        except ProbeUnavailable as exc:  # not an error: this figure does not exist for this instance
            if not exited(target):
                self._unavailable(state, target, probe, health, str(exc), now)
            return ProbeResult()
        except ProbeError as exc:
            if not exited(target):
                self._failed(state, probe.name, health, exc, started)
            return ProbeResult()
        except Exception as exc:  # a probe bug must not take the agent down
            log.exception("probe %s crashed on %s", probe.name, state.name)
            self._failed(state, probe.name, health, exc, started)
            return ProbeResult()
        if result.snapshots:
            self._store_snapshots(result)
        for event in result.events:
            self.events.emit(
                event.kind, event.message, instance=state.name, severity=event.severity, **event.data
            )
        elapsed = time.perf_counter() - started
        health.last_duration = elapsed
        if health.unavailable is not None:  # its first miss was noted in `_unavailable_since`
            since = self._unavailable_since.pop((state.name, probe.name), None)
            self.events.emit(
                "probe_recovered",
                f"probe {probe.name} has data again, after {now - (since or now):.0f}s without: "
                f"{health.unavailable}",
                instance=state.name,
                probe=probe.name,
                after="unavailable",
                unavailable_for=round(now - (since or now), 3),
            )
        health.unavailable = None
        if result.samples or result.snapshots or result.processes:
            health.has_figures = True
        if result.problems:
            if not exited(target):
                self._failed(state, probe.name, health, result.problems[0], started, partial=True)
        else:
            if not health.ok:
                self.events.emit(
                    "probe_recovered",
                    f"probe {probe.name} works again, after: {health.last_error}",
                    instance=state.name,
                    probe=probe.name,
                    after="error",
                )
            health.ok, health.last_error = True, None
            self.observe(probe.name, elapsed, True)
        health.last_success = now
        return result

    def _unavailable(
        self,
        state: InstanceState,
        target: ProbeTarget,
        probe: Probe,
        health: ProbeHealth,
        message: str,
        now: float,
    ) -> None:
        """Record that `probe` has no data for the instance: one event per change of reason, none
        while the process is younger than the grace period, and a retry that backs off."""
        if health.unavailable is None and now - target.start_time < self.grace:
            return  # still starting: tried again on the next tick, without a word
        since = self._unavailable_since.setdefault((state.name, probe.name), now)
        if health.unavailable != message:
            self.events.emit(
                "probe_unavailable",
                f"probe {probe.name} has no data here: {message}",
                instance=state.name,
                probe=probe.name,
            )
        health.unavailable = message
        health.retry_at = now + min(UNAVAILABLE_RETRY, max(1.0, (now - since) / 2))

    def _store_snapshots(self, result: ProbeResult) -> None:
        """Store the run's snapshots; one that cannot be written is a problem of the run."""
        for snapshot in result.snapshots:
            try:
                self.histograms.add(snapshot)
            except StoreError as exc:
                result.problems.append(exc)

    def _failed(
        self,
        state: InstanceState,
        probe: str,
        health: ProbeHealth,
        exc: Exception,
        started: float,
        partial: bool = False,
    ) -> None:
        elapsed = time.perf_counter() - started
        health.last_duration = elapsed
        health.errors_total += 1
        message = str(exc) or type(exc).__name__
        if health.ok or health.last_error != message:
            self.events.emit(
                "probe_error",
                f"probe {probe} {'partly ' if partial else ''}failed: {message}",
                instance=state.name,
                severity="warning",
                probe=probe,
                reason=getattr(exc, "reason", "error"),
                partial=partial,
            )
        health.ok, health.last_error = False, message
        self.observe(probe, elapsed, False)


def announce_ceilings(state: InstanceState, events: EventLog) -> None:
    """One `memory_ceilings` event when a JVM's ceilings are first read or change (call it under the
    tracker's lock, after the probes' figures and notes were published)."""
    found = ceilings(state.memory_limit, state.memory_limit_source, state.notes, state.latest)
    if len(found) < 2:
        return
    heap = found[1]
    text = "; ".join(c.describe() for c in found[1:])
    if heap.bytes is None:
        container = found[0]
        text = (
            f"the JVM's heap ceiling is unknown ({heap.detail}): heap growth is projected to "
            f"{container.describe()} instead; start it with -Xmx, or let medic attach with jcmd"
        )
    else:
        text = f"the JVM's own ceilings: {text}; and {found[0].describe()}"
    if text == state.ceilings_said:
        return
    state.ceilings_said = text
    events.emit(
        "memory_ceilings",
        text,
        instance=state.name,
        severity="warning" if heap.bytes is None else "info",
        ceilings=[c.to_dict() for c in found],
    )


def exited(target: ProbeTarget) -> bool:
    """Whether the process ended (gone, or a zombie) by the time a probe failed on it: its hook socket
    gone with it is its exit, which the tracker reports, not a probe without data to explain."""
    return by_pid(target.pid) is None  # the identity (a reused pid) is the tracker's to check
