"""The load: the same request sequence to both builds, in pairs, at a rate or a concurrency.

Request k of the set (round robin) goes to both builds as one pair, one after the other on the
same worker, so machine noise at that moment hits both. Which build gets it first alternates
between rounds in the ABBA pattern (round 1 baseline first, rounds 2 and 3 candidate first,
round 4 baseline first, and so on), which cancels the advantage of going first (a warm client,
a core just freed).

With `rate`, a dispatcher offers one pair every 1/rate seconds to a pool of workers; a pair that
finds every worker busy and the queue full is skipped for both builds (counted), so a slow build
never gets fewer requests than the other. With `concurrency`, N workers send pairs back to back.

Each connection is a kept-alive `http.client` connection (its per-request cost is a fraction of a
millisecond, so client time hardly dilutes a server's slowdown), with a timeout per request and
answers read up to `MAX_ANSWER` bytes.
"""

from __future__ import annotations

import http.client
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from agent.jobs.warmup import WarmupRequest

ABBA = (0, 1, 1, 0)  # per round: 0 = baseline first, 1 = candidate first
MAX_ANSWER = 16 * 2**20
MAX_ERROR_KINDS = 20


@dataclass(slots=True)
class Record:
    """What one build answered: one entry per request sent."""

    sent: list[float] = field(default_factory=list)  # monotonic seconds
    latency: list[float] = field(default_factory=list)  # seconds; the time of the failure for errors
    ok: list[bool] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, sent: float, latency: float, error: str | None) -> None:
        with self.lock:
            self.sent.append(sent)
            self.latency.append(latency)
            self.ok.append(error is None)
            if error is not None and (error in self.errors or len(self.errors) < MAX_ERROR_KINDS):
                self.errors[error] += 1

    @property
    def count(self) -> int:
        return len(self.ok)

    @property
    def failures(self) -> int:
        return self.ok.count(False)


class Target:
    """One build's end of one worker: a kept-alive connection to its base URL."""

    def __init__(self, base_url: str, timeout: float) -> None:
        parts = urlsplit(base_url)
        self.base_url = base_url
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def send(self, request: WarmupRequest) -> tuple[float, str | None]:
        """(seconds, error); error None for a 2xx answer read whole."""
        path = urlsplit(request.url(self.base_url))
        target = (path.path or "/") + (f"?{path.query}" if path.query else "")
        started = time.perf_counter()
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self.conn.request(request.method, target, request.body, request.headers)
            reply = self.conn.getresponse()
            body = reply.read(MAX_ANSWER + 1)
            elapsed = time.perf_counter() - started
            if len(body) > MAX_ANSWER:
                self.close()
                return elapsed, f"answer larger than {MAX_ANSWER // 2**20} MiB"
            if reply.will_close:
                self.close()
            if not 200 <= reply.status < 300:
                return elapsed, f"HTTP {reply.status} for {request.method} {target}"
            return elapsed, None
        except TimeoutError:
            self.close()
            return time.perf_counter() - started, f"no answer within {self.timeout:g}s"
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return time.perf_counter() - started, f"{type(exc).__name__}: {exc}"[:200]

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Driver:
    """Sends pairs to the two base URLs; `run(seconds, first)` for one round."""

    def __init__(
        self,
        requests: Sequence[WarmupRequest],
        urls: tuple[str, str],
        *,
        rate: float | None,
        concurrency: int | None,
        timeout: float,
    ) -> None:
        if not requests:
            raise ValueError("the driver needs at least one request")
        if (rate is None) == (concurrency is None):
            raise ValueError("give a rate or a concurrency")
        self.requests = list(requests)
        self.urls = urls
        self.rate = rate
        self.concurrency = concurrency
        self.timeout = timeout
        self.workers = concurrency or max(2, min(32, int(rate * 0.05) + 2))  # type: ignore[operator]
        self.records = (Record(), Record())
        self.active = self.records  # the records of the phase running now (warm-up ones are not kept)
        self.next_index = 0
        self.skipped = 0
        self.stopping = threading.Event()
        self._index_lock = threading.Lock()

    def _take_index(self) -> int:
        with self._index_lock:
            index = self.next_index
            self.next_index += 1
            return index

    def run(
        self, seconds: float, first: int, record: bool = True, tick: Callable[[], None] | None = None
    ) -> None:
        """Drive both builds for `seconds`; build `first` (0 baseline, 1 candidate) goes first in each pair."""
        deadline = time.monotonic() + seconds
        sinks = self.records if record else (Record(), Record())
        self.active = sinks
        order = (first, 1 - first)
        offered: queue.Queue[int | None] = queue.Queue(maxsize=self.workers * 2)

        def work() -> None:
            targets = (Target(self.urls[0], self.timeout), Target(self.urls[1], self.timeout))
            try:
                while not self.stopping.is_set():
                    if self.rate is not None:
                        try:
                            index = offered.get(timeout=0.2)
                        except queue.Empty:
                            if time.monotonic() >= deadline:
                                return
                            continue
                        if index is None:
                            return
                    else:
                        if time.monotonic() >= deadline:
                            return
                        index = self._take_index()
                    request = self.requests[index % len(self.requests)]
                    for build in order:
                        sent = time.monotonic()
                        latency, error = targets[build].send(request)
                        sinks[build].add(sent, latency, error)
            finally:
                for target in targets:
                    target.close()

        threads = [
            threading.Thread(target=work, name=f"guardrail-load-{i}", daemon=True)
            for i in range(self.workers)
        ]
        for thread in threads:
            thread.start()
        try:
            if self.rate is not None:
                self._dispatch(offered, deadline, tick)
            else:
                while time.monotonic() < deadline and not self.stopping.is_set():
                    time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                    if tick is not None:
                        tick()
        except BaseException:
            self.stopping.set()  # Ctrl-C, a dead server: the workers stop after their current request
            raise
        finally:
            wait = 1.0 if self.stopping.is_set() else self.timeout + 1
            if self.rate is not None:
                for _ in threads:
                    try:
                        offered.put(None, timeout=wait)
                    except queue.Full:
                        break
            for thread in threads:
                thread.join(timeout=wait * 2)

    def _dispatch(
        self, offered: queue.Queue[int | None], deadline: float, tick: Callable[[], None] | None
    ) -> None:
        assert self.rate is not None
        period = 1.0 / self.rate
        due = time.monotonic()
        last_tick = due
        while not self.stopping.is_set():
            now = time.monotonic()
            if now >= deadline:
                return
            if now >= due:
                index = self._take_index()
                try:
                    offered.put_nowait(index)
                except queue.Full:
                    self.skipped += 1
                due += period
                if due < now - 1.0:  # far behind (a stalled machine): no burst to catch up
                    due = now
                continue
            if tick is not None and now - last_tick >= 0.2:
                tick()
                last_tick = now
            time.sleep(min(due - now, deadline - now, 0.05))

    def stop(self) -> None:
        self.stopping.set()


def round_order(round_index: int) -> int:
    """Which build goes first in round `round_index` (0-based): ABBA, repeated."""
    return ABBA[round_index % len(ABBA)]
