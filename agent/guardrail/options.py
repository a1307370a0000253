"""What one guardrail run is asked to do, checked before anything starts.

Every problem is a `UsageError` (exit 2) that names the flag and the expected form: a launch
template without `{port}`, a duration or rate out of bounds, a request directory that is missing
or holds a request that points at one server for both builds.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from agent.core.errors import ConfigError, UsageError
from agent.core.units import parse_duration, parse_size
from agent.jobs.warmup import WarmupRequest, load_requests

PORT = "{port}"
MAX_RATE = 1000.0  # requests a second to each build
MAX_CONCURRENCY = 64
MAX_DURATION = 7 * 86400.0
MIN_DURATION = 5.0
MAX_ROUNDS = 64
MAX_TEMPLATE = 64 * 1024
_RATE_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One build: a command template to launch (with `{port}`), or a running server's URL and pid."""

    name: str  # "baseline" or "candidate"
    argv: tuple[str, ...] = ()
    url: str | None = None
    pid: int | None = None

    @property
    def launched(self) -> bool:
        return bool(self.argv)

    def command(self, port: int) -> list[str]:
        return [part.replace(PORT, str(port)) for part in self.argv]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "argv": list(self.argv), "url": self.url, "pid": self.pid}


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a difference is a regression (docs/guardrail.md lists the defaults and why)."""

    slower_p50: float = 0.10  # candidate p50 over baseline p50, minus 1
    slower_p99: float = 0.20
    cpu: float = 0.20  # CPU seconds per request, relative
    errors: float = 0.001  # error ratio, absolute (0.1 percentage point)
    peak: float = 0.10  # peak RSS, relative ...
    peak_bytes: float = 32 * 2**20  # ... and at least this much
    leak_rate: float = 256 * 1024 / 60  # bytes a second of growth that counts (256 KiB/min)
    leak_margin: float = 0.5  # when both grow: the candidate 50 % faster
    confidence: float = 0.99  # of the statistical tests

    def to_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class Options:
    baseline: ServerSpec
    candidate: ServerSpec
    requests: list[WarmupRequest]
    requests_dir: str
    duration: float = 600.0
    warmup: float = 60.0
    rate: float | None = 20.0
    concurrency: int | None = None
    rounds: int = 2
    ready_url: str | None = None
    limit: int = 4 * 2**30
    start_timeout: float = 60.0
    timeout: float = 10.0
    histogram: str | None = None  # the servers' own latency histogram at /metrics
    metrics_path: str = "/metrics"
    thresholds: Thresholds = field(default_factory=Thresholds)
    bootstrap: int = 1000
    seed: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline.to_dict(),
            "candidate": self.candidate.to_dict(),
            "requests_dir": self.requests_dir,
            "requests": len(self.requests),
            "duration_seconds": self.duration,
            "warmup_seconds": self.warmup,
            "rate_per_second": self.rate,
            "concurrency": self.concurrency,
            "rounds": self.rounds,
            "ready_url": self.ready_url,
            "limit_bytes": self.limit,
            "histogram": self.histogram,
            "thresholds": self.thresholds.to_dict(),
        }


def parse_template(text: str, flag: str) -> tuple[str, ...]:
    """An argv template from a shell-like string; it must hold `{port}`."""
    if len(text) > MAX_TEMPLATE:
        raise UsageError(f"{flag}: longer than {MAX_TEMPLATE // 1024} KiB")
    try:
        argv = tuple(shlex.split(text))
    except ValueError as exc:
        raise UsageError(f"{flag}: cannot split {text[:80]!r} into arguments: {exc}") from None
    if not argv:
        raise UsageError(f"{flag}: an empty command; give e.g. 'python -m myserver --port {PORT}'")
    if not any(PORT in part for part in argv):
        raise UsageError(
            f"{flag}: the command must say where to listen with {PORT}, e.g. "
            f"'python -m myserver --port {PORT}' (medic picks a free loopback port for each build)"
        )
    return argv


def parse_rate(text: str) -> float:
    """Requests a second from `50/s`, `600/min`, `2/m`; `UsageError` outside 0.1..1000 a second."""
    number, sep, unit = str(text).strip().partition("/")
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    per = _RATE_UNITS.get(unit.strip().lower()) if sep else None
    if per is None or not math.isfinite(value):
        raise UsageError(f"--rate: expected requests per time such as 50/s or 600/min, got {text!r}")
    rate = value / per
    if not 0.1 <= rate <= MAX_RATE:
        raise UsageError(f"--rate: between 0.1/s and {MAX_RATE:g}/s to each build, got {text!r}")
    return rate


def parse_span(text: str, flag: str, low: float, high: float) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    if not low <= seconds <= high:
        raise UsageError(f"{flag}: between {low:g}s and {high:g}s, got {text!r}")
    return seconds


def parse_fraction(text: str, flag: str, high: float = 10.0) -> float:
    """`10%` or `0.1` as 0.1."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= high:
        raise UsageError(f"{flag}: a fraction such as 10% or 0.1 (0 to {high * 100:g}%), got {text!r}")
    return value


def parse_leak_rate(text: str) -> float:
    """Bytes a second from `256Ki/min`, `1Mi/min`, `4Ki/s`."""
    size, sep, unit = str(text).strip().partition("/")
    per = _RATE_UNITS.get(unit.strip().lower()) if sep else None
    try:
        amount = parse_size(size)
    except ValueError:
        amount = -1
    if per is None or amount < 0 or amount > 2**40:
        raise UsageError(
            f"--leak-threshold: expected a size per time such as 256Ki/min or 4Ki/s, got {text!r}"
        )
    return amount / per


def parse_ready_url(text: str | None) -> str | None:
    if text is None:
        return None
    if not text.startswith("/") or any(c in text for c in " \t\r\n") or len(text) > 2048:
        raise UsageError(f"--ready-url: a path on each server such as /healthz, got {text[:80]!r}")
    return text


def check_url(text: str, flag: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(text)
    if parts.scheme != "http" or not parts.hostname or len(text) > 2048:
        raise UsageError(
            f"{flag}: an http:// URL of a running server such as http://127.0.0.1:8501, got {text[:80]!r}"
        )
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError:
        raise UsageError(f"{flag}: a port between 1 and 65535, got {text[:80]!r}") from None
    return text.rstrip("/") + "/"


def server_spec(name: str, template: str | None, url: str | None, pid: int | None) -> ServerSpec:
    """The `--NAME` template, or `--NAME-url` with `--NAME-pid`: exactly one of the two ways."""
    if template and (url or pid is not None):
        raise UsageError(f"--{name}: give a command template or --{name}-url with --{name}-pid, not both")
    if template:
        return ServerSpec(name, argv=parse_template(template, f"--{name}"))
    if not url or pid is None:
        raise UsageError(
            f"--{name}: give the command that starts the {name} build (with {PORT}), "
            f"or --{name}-url and --{name}-pid for a server already running"
        )
    if not 1 <= pid <= 2**22:
        raise UsageError(f"--{name}-pid: a process id, got {pid}")
    return ServerSpec(name, url=check_url(url, f"--{name}-url"), pid=pid)


def load_request_set(directory: str) -> list[WarmupRequest]:
    """The warm-up request files (`agent.jobs.warmup.load_requests`); both builds get the same."""
    try:
        requests = load_requests(directory)
    except ConfigError as exc:
        raise UsageError(f"--requests: {exc}") from None
    for request in requests:
        if request.target.startswith(("http://", "https://")):
            raise UsageError(
                f"--requests: {request.source} names an absolute URL ({request.target[:80]}); the guardrail "
                "sends each request to both builds, so give a path such as /v1/predict"
            )
    return requests
