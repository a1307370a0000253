"""The `canary` probe: an active request to the instance on a schedule, timed end to end.

The request runs in its own thread so that a slow or hung instance never holds up the probe
tick; `collect` starts a canary when `interval` has passed since the last one started *and*
none is in flight, and returns the outcomes finished since the previous tick. So the load it
adds is bounded: at most one request in flight per instance, at most one per `interval`, each
cut off after `timeout` (docs/latency.md).

A canary succeeds on a 2xx answer. A failed one stores `canary_success 0` and reports the
failure as a probe problem (so it shows in the probe's health and the event log); the latency
is stored whenever an answer came back, whatever its status.

Config (`instances[].latency.canary`): `url`, `method`, `headers`, `body_file`, `timeout`, `interval`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from agent.core.bounded import read_regular_file
from agent.core.errors import ProbeError, UnsafePath
from agent.core.records import ProbeResult, ProbeTarget, Sample
from probes.base import Schedule
from probes.latency import latency_settings

if TYPE_CHECKING:
    import httpx  # loads with the first canary (probes.scrape), not with the probe

MAX_BODY_FILE = 16 * 2**20
SETTING = "latency.canary.url"


@dataclass(frozen=True, slots=True)
class CanaryOutcome:
    ts: float  # wall time the answer (or the failure) came
    ok: bool
    latency: float | None  # seconds, when an answer came back
    status: int | None
    error: str | None = None


@dataclass(slots=True)
class _Schedule:
    last_start: float | None = None  # monotonic
    in_flight: threading.Thread | None = None
    finished: list[CanaryOutcome] = field(default_factory=list)


def read_body(spec: Mapping[str, Any]) -> bytes | None:
    path = spec.get("body_file")
    if not path:
        return None
    try:
        return read_regular_file(Path(path), MAX_BODY_FILE)  # a FIFO there would hold the canary for ever
    except UnsafePath as exc:
        raise ProbeError(f"canary body_file refused: {exc}; check latency.canary.body_file") from None
    except OSError as exc:
        raise ProbeError(
            f"cannot read the canary body_file {path}: {exc.strerror}; check latency.canary.body_file"
        ) from None


def send_canary(client: httpx.Client, spec: Mapping[str, Any]) -> CanaryOutcome:
    """One canary request, never raising: failures become an outcome with `error`."""
    from probes.scrape import fetch  # with its httpx, loaded by the first canary (none by default)

    try:
        reply = fetch(
            client,
            str(spec.get("method") or "GET"),
            spec["url"],
            timeout=float(spec.get("timeout", 2.0)),
            setting=SETTING,
            headers=dict(spec.get("headers") or {}),
            content=read_body(spec),
        )
    except ProbeError as exc:
        return CanaryOutcome(time.time(), False, None, None, f"canary failed: {exc}")
    ok = 200 <= reply.status < 300
    error = None if ok else f"canary to {spec['url']} answered HTTP {reply.status} (expected 2xx)"
    return CanaryOutcome(time.time(), ok, reply.elapsed, reply.status, error)


class CanaryProbe:
    name: ClassVar[str] = "canary"
    schedule: ClassVar[Schedule] = "fast"

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._client: httpx.Client | None = None  # made by the first canary
        self._schedules: dict[tuple[int, float], _Schedule] = {}
        self._lock = threading.Lock()

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        spec = latency_settings(target, "canary")
        if spec is None:
            return ProbeResult()
        key = (target.pid, target.start_time)
        with self._lock:
            schedule = self._schedules.setdefault(key, _Schedule())
            finished, schedule.finished = schedule.finished, []
            if schedule.in_flight is None and self._due(schedule, float(spec.get("interval", 10.0))):
                self._start(schedule, spec)
        return _result(target.instance, finished)

    def in_flight(self, target: ProbeTarget) -> bool:
        with self._lock:
            schedule = self._schedules.get((target.pid, target.start_time))
            return schedule is not None and schedule.in_flight is not None

    def forget(self, target: ProbeTarget) -> None:
        with self._lock:
            self._schedules.pop((target.pid, target.start_time), None)

    def close(self, timeout: float = 5.0) -> None:
        """Wait for the canaries in flight, then close the kept-alive connections: the agent's probe lives
        as long as the agent, a test's does not."""
        with self._lock:
            running = [s.in_flight for s in self._schedules.values() if s.in_flight is not None]
        for thread in running:
            thread.join(timeout)
        if self._client is not None:
            self._client.close()
            self._client = None

    def _due(self, schedule: _Schedule, interval: float) -> bool:
        return schedule.last_start is None or self._clock() - schedule.last_start >= interval

    def _start(self, schedule: _Schedule, spec: Mapping[str, Any]) -> None:
        if self._client is None:
            from probes.scrape import new_client

            self._client = new_client()
        client = self._client

        def run() -> None:
            outcome = send_canary(client, spec)
            with self._lock:
                schedule.finished.append(outcome)
                schedule.in_flight = None

        schedule.last_start = self._clock()
        schedule.in_flight = threading.Thread(target=run, name="medic-canary", daemon=True)
        schedule.in_flight.start()


def _result(instance: str, outcomes: list[CanaryOutcome]) -> ProbeResult:
    result = ProbeResult()
    for outcome in outcomes:
        result.samples.append(Sample(instance, "canary_success", outcome.ts, 1.0 if outcome.ok else 0.0))
        if outcome.latency is not None:
            result.samples.append(Sample(instance, "canary_latency_seconds", outcome.ts, outcome.latency))
        if outcome.error:
            result.problems.append(ProbeError(outcome.error))
    return result
