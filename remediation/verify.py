"""Verify a restart before its slot is released: a new process that stays up, a healthy answer,
and a warm-up gate (the latency part of medic) when one is installed.

    1. process up: `locate` finds a process other than the old one, and the same one again after
       `stable_for` (a new process that crashes at once is not a success)
    2. health: `health_url` answers 2xx (polled)
    3. warm-up: `warmup_gate(new view, deadline)` returns an ok Decision, typically after replaying
       warm-up requests until latency is acceptable; its Decision becomes the action's `warmup`
       stage. Not warm in time: verification fails (`on_cold: escalate`), or the slot is released
       all the same with a warning (`on_cold: release`)

All within `timeout`; the engine holds the fleet slot until this returns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

from agent.core.bounded import bounded_request
from agent.core.records import ProcessIdentity
from probes.linux.procfs import same_process
from remediation.actuators.base import Locator, fill
from remediation.model import Decision, InstanceView, RemediationRequest

STAGE = "verify"
MAX_ANSWER_BYTES = 2**20  # a health endpoint answers a few bytes
# warmup_gate(the new process's view, deadline as unix time) -> ok when it may take traffic
WarmupGate = Callable[[InstanceView, float], Decision]


class Verifier:
    def __init__(
        self,
        locate: Locator,
        *,
        timeout: float = 300.0,
        stable_for: float = 5.0,
        health_url: str | None = None,
        warmup_gate: WarmupGate | None = None,
        on_cold: str = "escalate",
        poll: float = 0.2,
    ) -> None:
        self.on_cold = on_cold  # not warm by the deadline: "escalate" (verification fails) or "release"
        self.locate = locate
        self.timeout = timeout
        self.stable_for = stable_for
        self.health_url = health_url
        self.warmup_gate = warmup_gate
        self.poll = poll

    def verify(
        self, before: InstanceView, request: RemediationRequest | None, stop: threading.Event
    ) -> Decision:
        started = time.monotonic()
        deadline = started + self.timeout
        timings: dict[str, float] = {}
        new = self._new_stable_process(before, deadline, stop)
        if new is None:
            return Decision.block(
                STAGE,
                "not-up",
                f"no new process of {before.name} stayed up {self.stable_for:g}s within {self.timeout:g}s",
                timings=timings,
            )
        timings["process_up"] = time.monotonic() - started
        view = replace(before, pid=new.pid, start_time=new.start_time, ready=False)
        if self.health_url:
            healthy = self._healthy(fill(self.health_url, view, request), deadline, stop)
            if not healthy.ok:
                return Decision.block(STAGE, "unhealthy", healthy.reason, new_pid=new.pid, timings=timings)
            timings["healthy"] = time.monotonic() - started
        warmup: dict[str, object] = {}
        if self.warmup_gate is not None:
            remaining = deadline - time.monotonic()
            gate_started = time.monotonic()
            try:
                warm = self.warmup_gate(view, time.time() + max(0.0, remaining))
            except Exception as exc:  # injected: report, never propagate
                warm = Decision.block("warmup", "error", f"the warm-up gate failed: {exc}")
            warmup = {**warm.to_dict(), "seconds": round(time.monotonic() - gate_started, 3)}
            if not warm.ok and self.on_cold != "release":
                return Decision.block(
                    STAGE, "not-warm", warm.reason, new_pid=new.pid, timings=timings, warmup=warmup
                )
            timings["warm" if warm.ok else "released_cold"] = time.monotonic() - started
        return Decision.allow(
            STAGE,
            f"{before.name} is back: pid {new.pid}, up after {timings['process_up']:.1f}s"
            + (", healthy" if "healthy" in timings else "")
            + (", warmed up" if "warm" in timings else "")
            + (
                ", released before it was warm (verify.warmup.on_cold: release)"
                if "released_cold" in timings
                else ""
            ),
            new_pid=new.pid,
            new_start_time=new.start_time,
            timings=timings,
            **({"warmup": warmup} if warmup else {}),  # type: ignore[arg-type]  # data, not a parameter
        )

    def _new_stable_process(
        self, before: InstanceView, deadline: float, stop: threading.Event
    ) -> ProcessIdentity | None:
        candidate: ProcessIdentity | None = None
        since = 0.0
        while time.monotonic() < deadline and not stop.is_set():
            current = self.locate(before.name)
            if current is not None and _is_old(current, before):
                current = None
            if current is None or candidate is None or not _same(current, candidate):
                candidate, since = current, time.monotonic()
            if candidate is not None and time.monotonic() - since >= self.stable_for:
                return candidate
            stop.wait(self.poll)
        return None

    def _healthy(self, url: str, deadline: float, stop: threading.Event) -> Decision:
        import httpx  # loaded by the first health URL: an agent without one does not carry it

        last = "no answer yet"
        while time.monotonic() < deadline and not stop.is_set():
            try:
                wait = max(0.1, min(5.0, deadline - time.monotonic()))
                response = bounded_request(
                    httpx, "GET", url, max_bytes=MAX_ANSWER_BYTES, seconds=wait, timeout=wait, trust_env=False
                )
                if 200 <= response.status_code < 300:
                    return Decision.allow(STAGE, f"GET {url} answered {response.status_code}")
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last = f"{exc.__class__.__name__}: {exc}"
            stop.wait(min(0.5, self.poll * 2))
        return Decision.block(STAGE, "unhealthy", f"GET {url} never answered 2xx in time (last: {last})")


def _is_old(identity: ProcessIdentity, before: InstanceView) -> bool:
    return identity.pid == before.pid and same_process(identity.start_time, before.start_time or 0.0)


def _same(a: ProcessIdentity, b: ProcessIdentity) -> bool:
    return a.pid == b.pid and same_process(a.start_time, b.start_time)
