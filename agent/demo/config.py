"""The demo's settings and the medic config it runs: a pure function of both (the tests validate it).

Time is compressed for a demo (docs/demo.md): memory judged over 30 s windows against a limit a
few minutes away, latency against a 100 ms p99 SLO over 10 s, restarts spaced by 15 s.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.core.errors import UsageError
from agent.core.units import format_bytes
from agent.demo.model import ModelShape

HISTOGRAM = "demo_request_latency_seconds"  # exported by agent.demo.server
FLEET = "demo"
SERVER_MODULE = "agent.demo.server"
# the detectors on a compressed time axis (docs/demo.md): a 30 s memory window in 1.25 s buckets,
# judged every 5 s; before a daily profile is known the window scale speaks when the limit is
# under horizon / 6 = 5 min away
DETECT: dict[str, Any] = {
    "interval": "1s",
    "memory": {"window": "30s", "long_window": "60s", "warmup": "5s", "season": "6s", "horizon": "30m"},
    # a server starved of CPU for a moment by a busy host is not the slow one: 20 ms above its peers
    # for five judgements in a row, where production's 5 ms over 2 judgements of 30 s sees minutes
    "slow": {
        "step": "1s", "stale": "60s", "peer_window": "10s", "trend_window": "30s", "horizon": "60s",
        "peer_floor": "20ms", "open_after": 5,
    },
}  # fmt: skip
AGENT: dict[str, Any] = {
    "interval": "0.5s",
    "slow_interval": "2s",
    "discovery_interval": "1s",
    "flush_interval": "0.5s",
    # the servers run medic's in-process hook for allocation sites (pyhist), not for allocator
    # figures; they are neither JVMs nor heap-profiled
    "probes": {"allocator": False, "pyhist": True, "jvm": False, "heapprof": False},
}
# what names the leak's suspect: the type histogram (every type kept), whose count of onnxruntime
# OrtValue objects grows with the outputs the leaking server keeps. Its walk of a server's objects
# holds the GIL for 35 to 150 ms on a busy 2-core host, which the peer comparison of latencies sees:
# so it is taken of the leaking server alone (a demo knows which one that is), every 5 s.
# Allocation sites stay off: tracemalloc makes a request eight times slower here, and its snapshot
# holds the GIL for a quarter of a second or more.
HOOK_ENV = {"leak": {"MEDIC_HOOK_SOCKET": "auto"}}  # agent.demo.server starts the hook when it is set
HISTOGRAMS: dict[str, Any] = {"python": {"interval": "5s", "top": 1000, "sites": {"on_leak": False}}}


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """What the user can change; everything else is the compressed config above."""

    healthy: int = 2
    leak: int = 1
    slow: int = 1
    rps: float = 10.0  # requests a second to each server
    leak_rate: int = 2 * 2**20  # bytes a second the leaking servers keep
    memory_limit: int = 384 * 2**20
    slo: float = 0.1  # p99 latency SLO, seconds
    slow_growth: float = 0.002  # seconds of latency the slow server adds per second of uptime
    listen: str = "127.0.0.1:9464"
    shape: ModelShape = field(default_factory=ModelShape)

    def __post_init__(self) -> None:
        if min(self.healthy, self.leak, self.slow) < 0 or not 1 <= self.healthy + self.leak + self.slow <= 16:
            raise UsageError("give 1 to 16 servers in all (--healthy, --leak, --slow; none negative)")
        if not 0.5 <= self.rps <= 200:
            raise UsageError(f"--rps must be between 0.5 and 200 requests a second, got {self.rps:g}")
        if self.memory_limit < 128 * 2**20:
            raise UsageError(
                f"--memory-limit must be at least 128Mi (a server needs about 70 MiB), "
                f"got {format_bytes(self.memory_limit)}"
            )
        if not 0 < self.leak_rate <= 64 * 2**20:
            raise UsageError(f"--leak-rate must be above 0 and at most 64Mi a second, got {self.leak_rate}")

    @property
    def batch(self) -> int:
        """Rows per request, so that a leaking server keeps about `leak_rate` bytes a second."""
        per_request = self.leak_rate / self.rps
        return max(1, min(4096, round(per_request / self.shape.embedding_bytes(1))))

    @property
    def actual_leak_rate(self) -> float:
        return self.rps * self.shape.embedding_bytes(self.batch)


@dataclass(frozen=True, slots=True)
class ServerSpec:
    name: str
    behaviour: str
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def plan_servers(settings: DemoSettings, ports: list[int]) -> list[ServerSpec]:
    """serving-0, serving-1, ...: the healthy ones first, then the leaking and the slow ones."""
    kinds = ["healthy"] * settings.healthy + ["leak"] * settings.leak + ["slow"] * settings.slow
    if len(ports) < len(kinds):
        raise ValueError(f"need {len(kinds)} ports, got {len(ports)}")
    return [ServerSpec(f"serving-{i}", kind, port) for i, (kind, port) in enumerate(zip(kinds, ports))]


def server_argv(server: ServerSpec, model: Path, settings: DemoSettings) -> list[str]:
    argv = [sys.executable, "-m", SERVER_MODULE, "--model", str(model)]
    argv += ["--behaviour", server.behaviour, "--port", str(server.port)]
    if server.behaviour == "slow":
        argv += ["--slow-growth", f"{settings.slow_growth * 1000:g}ms"]
    if server.behaviour == "leak":
        argv += ["--leak-cap", str(2 * settings.memory_limit)]  # past the limit, never the whole host
    return argv


def demo_config(
    settings: DemoSettings, servers: list[ServerSpec], model: Path, state_dir: Path
) -> dict[str, object]:
    """The medic config of the demo, as plain data (`agent.config.loader.validate_config` accepts it)."""
    instances: list[dict[str, object]] = []
    overrides: dict[str, object] = {}
    for server in servers:
        instances.append(
            {
                "name": server.name,
                "labels": {"fleet": FLEET, "behaviour": server.behaviour},
                "match": {
                    "command": server_argv(server, model, settings),
                    "env": HOOK_ENV.get(server.behaviour, {}),
                },
                "memory_limit": settings.memory_limit,
                **({"histograms": HISTOGRAMS} if server.behaviour == "leak" else {}),
                "stop_timeout": "5s",
                "latency": {
                    "prometheus": {
                        "url": f"{server.url}/metrics",
                        "histogram": HISTOGRAM,
                        "errors_counter": "demo_request_errors",
                        "timeout": "1s",
                    },
                    "slo": {"quantile": 0.99, "threshold": settings.slo, "for": "10s"},
                },
            }
        )
        overrides[server.name] = {
            "verify": {"timeout": "30s", "stable_for": "2s", "health_url": f"{server.url}/healthz"}
        }
    return {
        "agent": {**AGENT, "listen": settings.listen, "state_dir": str(state_dir / "agent")},
        "detect": DETECT,
        "remediation": {
            "mode": "enforce",
            "interval": "1s",
            "budget": {"max_concurrent": 1, "min_interval": "15s", "max_per_hour": None, "cooldown": "60s"},
            "plan": {"safety_margin": "30s", "restart_duration": "10s", "deadline_granularity": "1s"},
            "blockers": {"min_uptime": "10s"},
            # a process that lived a minute was not crash-looping: the leak comes back every ~2 min
            "ladder": {"slow_confirm": "10s", "clear_check": "2m", "crash_loop": {"reset_after": "60s"}},
            "evidence": {"timeout": "5s", "max_bytes": "8Mi", "keep": 2},
            "instances": overrides,
        },
        "instances": instances,
    }
