"""The demo's load generator: one thread per server sends the same prediction request at a steady
rate over a kept-alive connection, and carries on through restarts (a refused connection counts
as an error and is retried on the next tick).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field

from agent.demo.server import PREDICT_PATH


def request_body(batch: int, features: int) -> bytes:
    """One predict request with `batch` rows of `features` values, encoded once and reused."""
    row = [round(0.01 * ((i * 7) % 100), 2) for i in range(features)]
    return json.dumps({"instances": [row] * batch}).encode()


@dataclass
class TargetStats:
    ok: int = 0
    errors: int = 0
    last_error: str = ""
    last_latency: float = 0.0


@dataclass
class LoadGenerator:
    """Sends `rps` requests a second to each port; `start()`, then `stop()` (idempotent)."""

    ports: dict[str, int]
    body: bytes
    rps: float = 10.0
    timeout: float = 10.0
    stats: dict[str, TargetStats] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for name, port in self.ports.items():
            self.stats[name] = TargetStats()
            thread = threading.Thread(target=self._drive, args=(name, port), name=f"load-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout + 1)

    def _drive(self, name: str, port: int) -> None:
        stats = self.stats[name]
        period = 1.0 / self.rps
        conn: http.client.HTTPConnection | None = None
        next_at = time.monotonic()
        while not self._stop.is_set():
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=self.timeout)
            started = time.monotonic()
            try:
                conn.request("POST", PREDICT_PATH, self.body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    stats.ok += 1
                else:
                    stats.errors += 1
                    stats.last_error = f"HTTP {response.status}"
                stats.last_latency = time.monotonic() - started
            except (OSError, http.client.HTTPException) as exc:
                stats.errors += 1
                stats.last_error = str(exc) or type(exc).__name__
                conn.close()
                conn = None
            next_at = max(next_at + period, time.monotonic())  # a slow answer lowers the rate, no burst after
            self._stop.wait(max(0.0, next_at - time.monotonic()))
        if conn is not None:
            conn.close()
