"""The one configuration model: the sections of medic's YAML config, validated with pydantic.

`Config` is the whole file; `agent.config.loader` reads it and turns every problem into one line
naming the file, the key path (`instances[0].match.pid`) and what was expected. Durations accept
`5s`/`10m`/`6h`, sizes `512Mi`/`2G`. The `detect`, `notify` and `remediation` sections and the
histogram probes' settings live beside the code that reads them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from agent.config.detect import DetectSection, Number
from agent.config.history import HistorySection
from agent.core.patterns import compile_pattern
from agent.core.types import DAY, HOUR, Duration, Interval, Strict, within
from agent.core.units import parse_size
from agent.notify.config import HttpUrl as BaseUrl
from agent.notify.config import NotifySection
from probes.settings import HeapProfiles, JvmHistograms, PythonHistograms
from remediation.config import RemediationSection


def _memory_limit(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ValueError(f"expected 'auto' (cgroup limit, else host memory) or a size: {exc}") from None


MemoryLimit = Annotated[Literal["auto"] | int, BeforeValidator(_memory_limit)]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class HttpSection(Strict):
    """The API server's limits against slow or greedy clients (agent/api/server.py, agent/api/guard.py)."""

    header_timeout: Annotated[Duration, within(0.1, 300)] = 10.0  # headers by then, the body as long again
    keep_alive: Annotated[Duration, within(1, 300)] = 5.0  # an idle keep-alive connection is closed after
    max_connections: int = Field(256, ge=8, le=65536)  # open connections; more are refused with 503
    max_body: Annotated[int, Field(ge=1024, le=2**30), BeforeValidator(parse_size)] = 64 * 1024


class AgentSection(Strict):
    listen: str = "127.0.0.1:9464"  # port 0: any free port (written to state_dir/agent.json)
    # Host names the API answers to (DNS-rebinding guard); default: the listen host and loopback,
    # plus this machine's names and addresses when listening on 0.0.0.0 or ::; ["*"] turns the check off
    allowed_hosts: list[str] | None = None
    http: HttpSection = Field(default_factory=HttpSection)
    state_dir: Path = Path("./medic-state")  # one agent per state dir (state_dir/lock)
    interval: Interval = 5.0
    # production seconds per real second, for a lab, a test or a demo: divides every duration medic
    # judges or waits by, detection's and remediation's (agent/config/timescale.py, docs/detection.md)
    time_scale: Annotated[Number, Field(ge=1, le=100_000)] = 1.0
    slow_interval: Annotated[Duration, within(0.05, DAY)] = 60.0
    discovery_interval: Interval = 10.0
    flush_interval: Interval = 2.0
    raw_retention: Duration = 48 * 3600.0
    rollup_retention: Duration = 30 * 86400.0
    probes: dict[str, bool] = Field(default_factory=dict)
    token_file: Path | None = None  # admin token for mutating endpoints; default: state_dir/admin.token
    # the `agent` label of alerts and of /metrics' medic_build_info (docs/alerts.md); default: agent_name()
    name: str | None = Field(None, min_length=1, max_length=253)
    # where people reach this agent (an ingress, a port-forward): alerts link to its dashboard there;
    # unset, alerts carry no link to the agent (its listen address is seldom one on-call can open)
    external_url: BaseUrl | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and (not value.isprintable() or value.strip() != value):
            raise ValueError(
                f"expected a printable name without surrounding spaces, such as ranker-7f9c, got {value!r}"
            )
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"expected HOST:PORT such as 127.0.0.1:9464, got {value!r}")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    def agent_name(self, environ: Mapping[str, str] | None = None) -> str:
        """How this agent is named in alerts and metrics: `name`, else the pod's name (`POD_NAME`,
        from the Downward API), else `HOSTNAME` (a container's is its pod's or its id), else the host's."""
        import os
        import socket

        env = os.environ if environ is None else environ
        return (
            self.name
            or env.get("POD_NAME", "").strip()
            or env.get("HOSTNAME", "").strip()
            or socket.gethostname()
        )


class MatchSpec(Strict):
    """How to find an instance's process: exactly one of pid, pidfile, cmdline, command."""

    pid: int | None = Field(default=None, gt=0, le=2**22)  # the kernel's PID_MAX_LIMIT
    pidfile: Path | None = None
    cmdline: str | None = None
    select: Literal["newest", "all"] = "newest"
    # `select: all` follows at most this many matches (a fork-heavy target must not flood medic)
    max_instances: int = Field(default=64, ge=1, le=1024)
    # the matched process brings its descendants (a server's workers) into the instance; at most
    # `max_children` of them are followed, nearest first (a fork-heavy target must not flood medic)
    children: bool = True
    max_children: int = Field(default=256, ge=1, le=4096)
    command: list[str] | None = None
    cwd: Path | None = None
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("command", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        if isinstance(value, str):
            return shlex.split(value)  # split like a shell would; never run through a shell
        return value

    @field_validator("cmdline")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            compile_pattern(value)  # PatternError (a ValueError) says what RE2 cannot take
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> MatchSpec:
        given = [k for k in ("pid", "pidfile", "cmdline", "command") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of pid, pidfile, cmdline (a regex) or command (a program to launch)"
                + (f"; got {', '.join(given)}" if given else "")
            )
        if self.command is not None and not self.command:
            raise ValueError("command must not be empty")
        if "max_instances" in self.model_fields_set and not (self.cmdline and self.select == "all"):
            raise ValueError("max_instances applies only to `cmdline` with `select: all`; remove it here")
        if "max_children" in self.model_fields_set and not self.children:
            raise ValueError("max_children applies only with `children: true`; remove it here")
        return self

    @property
    def managed(self) -> bool:
        return self.command is not None


def _http_url(value: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"expected an http:// or https:// URL such as http://127.0.0.1:8501/metrics, got {value!r}"
        )
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url)]
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
SLO_QUANTILES = (0.5, 0.9, 0.99, 0.999)  # the quantiles the latency probe stores


class LatencyCounters(Strict):
    """Two counters that a server keeps instead of a histogram (TorchServe, Triton): the time spent
    on requests and the requests counted; their increases give the mean latency of each interval."""

    total: str  # the running total of request time, e.g. ts_inference_latency_microseconds
    count: str  # the requests that time was spent on, e.g. ts_inference_requests_total

    @field_validator("total", "count")
    @classmethod
    def _names(cls, value: str) -> str:
        return _metric_name(value)


class PrometheusLatency(Strict):
    """The instance's own `/metrics`: a latency histogram, summary or pair of counters, and optional
    request/error counters."""

    url: HttpUrl
    histogram: str | None = None  # the family name, without `_bucket`
    summary: str | None = None  # the family name, without `_sum`/`_count`
    counters: LatencyCounters | None = None
    unit: Literal["seconds", "milliseconds", "microseconds"] = "seconds"  # of the source's figures
    labels: dict[str, str] = Field(default_factory=dict)  # only series with these label values
    errors_counter: str | None = None
    requests_counter: str | None = None  # default: the source's own count
    timeout: Annotated[Duration, within(0.01, 60)] = 2.0

    @field_validator("errors_counter", "requests_counter")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        return None if value is None else _metric_name(value)

    @field_validator("histogram", "summary")
    @classmethod
    def _family(cls, value: str | None) -> str | None:
        if value is None:
            return None
        _metric_name(value)
        for suffix in ("_bucket", "_count", "_sum"):
            if value.endswith(suffix):
                raise ValueError(f"give the family name without {suffix!r}: {value[: -len(suffix)]}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> PrometheusLatency:
        given = [key for key in SOURCES if getattr(self, key) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of {', '.join(SOURCES)} (got {', '.join(given) or 'none'}): "
                "histogram: request_latency_seconds, summary: model_infer_request_duration, or "
                "counters: {total: ts_inference_latency_microseconds, count: ts_inference_requests_total}"
            )
        return self


SOURCES = ("histogram", "summary", "counters")


def _metric_name(value: str) -> str:
    if not _METRIC_NAME.match(value):
        raise ValueError(f"expected a Prometheus metric name such as request_latency_seconds, got {value!r}")
    return value


class CanarySpec(Strict):
    """An active request on a schedule; at most one in flight per instance."""

    url: HttpUrl
    method: str = "GET"
    headers: dict[str, str] = Field(default_factory=dict)
    body_file: Path | None = None
    timeout: Annotated[Duration, within(0.01, HOUR)] = 2.0
    interval: Annotated[Duration, within(0.01, HOUR)] = 10.0

    @field_validator("method")
    @classmethod
    def _method(cls, value: str) -> str:
        if value.upper() not in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
            raise ValueError(f"expected an HTTP method such as GET or POST, got {value!r}")
        return value.upper()


class SloSpec(Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    quantile: float = 0.99
    # no default: the latency a service promises is its own, and a guessed one would page or stay quiet
    threshold: Annotated[Duration, within(0, HOUR, above=True, why="a latency such as 250ms")]
    # over the threshold this long → slow
    for_: Annotated[Duration, within(0, DAY)] = Field(300.0, alias="for")

    @field_validator("quantile")
    @classmethod
    def _quantile(cls, value: float) -> float:
        if value not in SLO_QUANTILES:
            raise ValueError(f"expected one of {', '.join(map(str, SLO_QUANTILES))}, got {value!r}")
        return value


class LatencySpec(Strict):
    """Where an instance's latency comes from, and the SLO it is judged against (none: no SLO rule)."""

    prometheus: PrometheusLatency | None = None
    canary: CanarySpec | None = None
    slo: SloSpec | None = None

    @model_validator(mode="after")
    def _slo_needs_quantiles(self) -> LatencySpec:
        if self.slo is not None and self.prometheus is not None and self.prometheus.counters is not None:
            raise ValueError(
                f"slo: latency.prometheus.counters give a mean latency, not a p{self.slo.quantile * 100:g}: "
                "an SLO on a quantile cannot be judged from a mean; remove slo (the peer and trend rules "
                "judge the mean), or read a histogram or a summary with quantiles instead"
            )
        return self


class HookSpec(Strict):
    """Where the instance's allocator hook listens (in-process Python hook or LD_PRELOAD shim)."""

    socket: str | None = None  # a path, `%p` becomes the pid; default: found by convention
    timeout: Annotated[Duration, within(0, 60, above=True)] = 1.0


class HistogramsSpec(Strict):
    jvm: JvmHistograms = Field(default_factory=JvmHistograms)
    python: PythonHistograms = Field(default_factory=PythonHistograms)
    heap_profiles: HeapProfiles | None = None  # opt-in: dumps need a directory the target can write


class InstanceSpec(Strict):
    name: str
    match: MatchSpec
    labels: dict[str, str] = Field(default_factory=dict)
    memory_limit: MemoryLimit = "auto"
    hook: HookSpec = Field(default_factory=HookSpec)
    restart_on_exit: bool = True  # managed only: relaunch when the command exits
    stop_timeout: Annotated[Duration, within(0, HOUR)] = 5.0  # managed only: TERM, then KILL after this
    latency: LatencySpec | None = None  # Prometheus histogram, canary, SLO (docs/latency.md)
    histograms: HistogramsSpec = Field(default_factory=HistogramsSpec)  # docs/histograms.md

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                "expected letters, digits, '.', '_' or '-' (at most 63), starting with a letter or digit"
            )
        return value


class Config(Strict):
    agent: AgentSection = Field(default_factory=AgentSection)
    detect: DetectSection = Field(default_factory=DetectSection)
    history: HistorySection = Field(default_factory=HistorySection)  # docs/detection.md
    instances: list[InstanceSpec] = Field(default_factory=list)
    notify: NotifySection = Field(default_factory=NotifySection)  # docs/alerts.md
    remediation: RemediationSection = Field(default_factory=RemediationSection)  # docs/remediation.md

    @model_validator(mode="after")
    def _unique_names(self) -> Config:
        seen: set[str] = set()
        for spec in self.instances:
            if spec.name in seen:
                raise ValueError(f"instance name {spec.name!r} is used twice")
            seen.add(spec.name)
        return self

    @model_validator(mode="after")
    def _one_watcher_per_process(self) -> Config:
        """Two instances that name the same pid, pidfile or regex would probe and restart one process
        twice: refused here; overlaps only visible at run time are reported then (agent/watch/claims.py)."""
        first: dict[tuple[str, str], str] = {}
        for spec in self.instances:
            match = spec.match
            key = (
                ("pid", str(match.pid))
                if match.pid is not None
                else ("pidfile", str(match.pidfile))
                if match.pidfile is not None
                else ("cmdline", match.cmdline)
                if match.cmdline is not None
                else None
            )
            if key is None:
                continue
            if key in first:
                raise ValueError(
                    f"instances {first[key]!r} and {spec.name!r} both match {key[0]} {key[1]!r}: one process "
                    "would be probed and restarted twice; keep one of them (its workers come with it: "
                    "match.children)"
                )
            first[key] = spec.name
        return self
