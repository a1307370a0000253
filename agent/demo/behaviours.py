"""What sets the demo's servers apart: each behaviour sees every answered request and may keep
memory or add latency. The inference itself is the same real onnxruntime run everywhere.

- `healthy`: nothing.
- `leak`: an unbounded response cache, the classic leak: every request's embedding output (an
  onnxruntime OrtValue, native memory) is kept under a fresh key and never read again. It stops
  growing at `cap` bytes so that a forgotten demo cannot take the host down.
- `slow`: latency that grows with uptime (`growth` seconds per second, at most `max_delay`), like
  a server whose request path scans a structure that only grows. The delay is a sleep, so the
  demo costs no CPU for it; a restart resets it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

NAMES = ("healthy", "leak", "slow")


class Behaviour:
    name: ClassVar[str] = "healthy"

    def keep(self, outputs: dict[str, Any]) -> None:
        """Called after each inference with its outputs (OrtValues by output name)."""

    def delay(self) -> float:
        """Seconds to add to this request's latency."""
        return 0.0

    def held_bytes(self) -> int:
        """Bytes this behaviour holds on purpose (shown on /healthz)."""
        return 0


class Healthy(Behaviour):
    name = "healthy"


@dataclass
class Leak(Behaviour):
    name: ClassVar[str] = "leak"
    cap: int = 1 << 30
    cache: dict[int, Any] = field(default_factory=dict)
    held: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def keep(self, outputs: dict[str, Any]) -> None:
        value = outputs["embedding"]
        size = _nbytes(value)
        with self._lock:
            if self.held + size <= self.cap:
                self.cache[len(self.cache)] = value
                self.held += size

    def held_bytes(self) -> int:
        return self.held


@dataclass
class Slow(Behaviour):
    name: ClassVar[str] = "slow"
    growth: float = 0.004
    max_delay: float = 2.0
    started: float = field(default_factory=time.monotonic)

    def delay(self) -> float:
        return min(self.max_delay, self.growth * (time.monotonic() - self.started))


def create(name: str, *, cap: int, growth: float, max_delay: float) -> Behaviour:
    """The behaviour called `name`; ValueError lists the known ones."""
    if name == "healthy":
        return Healthy()
    if name == "leak":
        return Leak(cap=cap)
    if name == "slow":
        return Slow(growth=growth, max_delay=max_delay)
    raise ValueError(f"unknown behaviour {name!r}; known: {', '.join(NAMES)}")


def _nbytes(value: Any) -> int:
    """Size of an OrtValue or numpy array, in bytes."""
    if hasattr(value, "nbytes"):
        return int(value.nbytes)
    shape = value.shape()
    count = 1
    for dim in shape:
        count *= int(dim)
    return count * 4  # the demo model's outputs are float32
