"""The one configuration model: the sections of medic's YAML config, validated with pydantic.

`Config` is the whole file; `agent.config.loader` reads it and turns every problem into one line
naming the file, the key path (`instances[0].match.pid`) and what was expected. Durations accept
`5s`/`10m`/`6h`, sizes `512Mi`/`2G`. The `detect`, `notify` and `remediation` sections and the
histogram probes' settings live beside the code that reads them.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from agent.config.detect import DetectSection, history_problems
from agent.config.history import HistorySection
from agent.core.patterns import compile_pattern
from agent.core.types import DAY, HOUR, Duration, Interval, Strict, within
from agent.core.units import parse_size
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
    slow_interval: Annotated[Duration, within(0.05, DAY)] = 60.0
    discovery_interval: Interval = 10.0
    flush_interval: Interval = 2.0
    raw_retention: Duration = 48 * 3600.0
    rollup_retention: Duration = 30 * 86400.0
    probes: dict[str, bool] = Field(default_factory=dict)
    token_file: Path | None = None  # admin token for mutating endpoints; default: state_dir/admin.token

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


class MatchSpec(Strict):
    """How to find an instance's process: exactly one of pid, pidfile, cmdline, command."""

    pid: int | None = Field(default=None, gt=0, le=2**22)  # the kernel's PID_MAX_LIMIT
    pidfile: Path | None = None
    cmdline: str | None = None
    select: Literal["newest", "all"] = "newest"
    # `select: all` follows at most this many matches (a fork-heavy target must not flood medic)
    max_instances: int = Field(default=64, ge=1, le=1024)
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


class PrometheusLatency(Strict):
    """The instance's own `/metrics`: a latency histogram and optional request/error counters."""

    url: HttpUrl
    histogram: str  # the family name, without `_bucket`
    labels: dict[str, str] = Field(default_factory=dict)  # only series with these label values
    errors_counter: str | None = None
    requests_counter: str | None = None  # default: the histogram's `_count`
    timeout: Annotated[Duration, within(0.01, 60)] = 2.0

    @field_validator("histogram", "errors_counter", "requests_counter")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        if value is not None and not _METRIC_NAME.match(value):
            raise ValueError(
                f"expected a Prometheus metric name such as request_latency_seconds, got {value!r}"
            )
        return value

    @field_validator("histogram")
    @classmethod
    def _family(cls, value: str) -> str:
        for suffix in ("_bucket", "_count", "_sum"):
            if value.endswith(suffix):
                raise ValueError(
                    f"give the histogram's family name without {suffix!r}: {value[: -len(suffix)]}"
                )
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
    def _history_kept(self) -> Config:
        """The store must keep the history the memory detectors read, at their resolution."""
        problems = history_problems(self.detect, self.agent.raw_retention, self.agent.interval)
        if problems:
            raise ValueError("; ".join(problems))
        return self
