"""The one configuration model: YAML validated with pydantic on load.

`load_config(path)` returns a validated `Config` or raises `ConfigError` whose message names
the file, the key path (`instances[0].match.pid`) and what was expected, one line per problem.
Durations accept `5s`/`10m`/`6h`, sizes `512Mi`/`2G`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from agent.core.errors import ConfigError
from agent.core.types import (
    DAY,
    HOUR,
    MAX_COUNT,
    MAX_DURATION,
    Duration,
    Interval,
    within,
)
from agent.core.units import parse_duration, parse_size
from agent.notify.config import NotifySection
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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HttpSection(_Strict):
    """The API server's limits against slow or greedy clients (agent/api/server.py, agent/api/guard.py)."""

    header_timeout: Annotated[Duration, within(0.1, 300)] = 10.0  # request headers must arrive by then
    keep_alive: Annotated[Duration, within(1, 300)] = 5.0  # an idle keep-alive connection is closed after
    max_connections: int = Field(256, ge=8, le=65536)  # open connections; more are refused with 503
    max_body: Annotated[int, Field(ge=1024, le=2**30), BeforeValidator(parse_size)] = 64 * 1024


class AgentSection(_Strict):
    listen: str = "127.0.0.1:9464"  # port 0: any free port (written to state_dir/agent.json)
    # Host names the API answers to (DNS-rebinding guard); default: the listen host and loopback,
    # plus this machine's names and addresses when listening on 0.0.0.0 or ::; ["*"] turns the check off
    allowed_hosts: list[str] | None = None
    http: HttpSection = Field(default_factory=HttpSection)
    state_dir: Path = Path("./medic-state")
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


class MatchSpec(_Strict):
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
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
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


class PrometheusLatency(_Strict):
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


class CanarySpec(_Strict):
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


class SloSpec(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    quantile: float = 0.99
    threshold: Annotated[Duration, within(0, HOUR, above=True, why="a latency such as 250ms")] = 0.25
    # over the threshold this long → slow
    for_: Annotated[Duration, within(0, DAY)] = Field(300.0, alias="for")

    @field_validator("quantile")
    @classmethod
    def _quantile(cls, value: float) -> float:
        if value not in SLO_QUANTILES:
            raise ValueError(f"expected one of {', '.join(map(str, SLO_QUANTILES))}, got {value!r}")
        return value


class LatencySpec(_Strict):
    """Where an instance's latency comes from, and the SLO it is judged against (none: no SLO rule)."""

    prometheus: PrometheusLatency | None = None
    canary: CanarySpec | None = None
    slo: SloSpec | None = None


class HookSpec(_Strict):
    """Where the instance's allocator hook listens (in-process Python hook or LD_PRELOAD shim)."""

    socket: str | None = None  # a path, `%p` becomes the pid; default: found by convention
    timeout: Annotated[Duration, within(0, 60, above=True)] = 1.0


class JvmHistograms(_Strict):
    """JVM targets (docs/histograms.md): class histograms, heap figures and NMT through jcmd."""

    interval: Annotated[Duration, within(1, DAY)] = 900.0  # GC.class_histogram
    heap_interval: Annotated[Duration, within(1, DAY)] = 60.0  # GC.heap_info, VM.native_memory
    live: bool = False  # the live histogram forces a full GC; -all (garbage included) otherwise
    live_floor: Annotated[Duration, within(60, MAX_DURATION)] = 3600.0  # at most one live histogram so often
    timeout: Annotated[Duration, within(1, HOUR)] = 60.0
    jcmd: str | None = None  # default: the jcmd beside the target's java, else PATH


class PythonHistograms(_Strict):
    """Python targets with the in-process hook: type histograms (gc-tracked objects)."""

    interval: Annotated[Duration, within(1, DAY)] = 300.0
    top: int = Field(200, ge=1, le=1000)
    budget: Annotated[Duration, within(0.001, 60)] = 1.0  # the walk holds the GIL at most this long


class HeapProfiles(_Strict):
    """Native heap profiles: dumped through the hook into `dir`, or read from jemalloc/gperftools dumps there."""

    dir: Path
    interval: Annotated[Duration, within(1, DAY)] = 600.0
    frames: int = Field(1, ge=1, le=8)  # frames outside the allocator that name a site
    keep: int = Field(8, ge=2, le=1000)  # dumps medic wrote that are kept on disk


class HistogramsSpec(_Strict):
    jvm: JvmHistograms = Field(default_factory=JvmHistograms)
    python: PythonHistograms = Field(default_factory=PythonHistograms)
    heap_profiles: HeapProfiles | None = None  # opt-in: dumps need a directory the target can write


class InstanceSpec(_Strict):
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


class DetectSection(_Strict):
    """Detector tunables: `memory` for leak / oom-risk / fragmentation, `slow` for latency.

    Keys are the fields of `agent.detect.DetectParams` and `agent.detect.slow.SlowParams`
    (durations as `6h`, sizes as `128Mi`); unknown keys are errors. docs/detection.md explains them.
    """

    interval: Interval = 15.0  # how often the job looks for a judgement instant it has not judged
    memory: dict[str, Any] = Field(default_factory=dict)
    slow: dict[str, Any] = Field(default_factory=dict)

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: dict[str, Any]) -> dict[str, Any]:
        from agent.detect import params_from_options

        params_from_options(**value)  # raises ValueError naming the option
        return value

    @field_validator("slow")
    @classmethod
    def _slow(cls, value: dict[str, Any]) -> dict[str, Any]:
        slow_params(value)
        return value

    def memory_params(self):  # -> DetectParams
        from agent.detect import params_from_options

        return params_from_options(**self.memory)

    def slow_params(self):  # -> SlowParams
        return slow_params(self.slow)


def slow_params(options: dict[str, Any]):  # -> SlowParams
    """SlowParams from config values; durations accept `30s`, counts and ratios plain numbers."""
    from dataclasses import fields

    from agent.detect.slow import SlowParams

    known = {f.name: f for f in fields(SlowParams)}
    values: dict[str, Any] = {}
    for name, raw in options.items():
        if name not in known:
            raise ValueError(f"unknown slow detection option {name!r}; known: {', '.join(sorted(known))}")
        try:
            values[name] = _count(raw) if known[name].type in ("int", int) else parse_duration(raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"slow detection option {name}: {exc}") from None
        if values[name] > MAX_DURATION:
            raise ValueError(f"slow detection option {name}: expected at most 365d, got {raw!r}")
    return SlowParams(**values)


def _count(raw: Any) -> int:
    """A whole number from config (`3`, `"3"`); refuses fractions, booleans, inf and values above MAX_COUNT."""
    if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
        raise ValueError(f"expected a whole number, got {raw!r}")
    value = int(raw)
    if not 0 <= value <= MAX_COUNT:
        raise ValueError(f"expected a whole number between 0 and {MAX_COUNT}, got {raw!r}")
    return value


class Config(_Strict):
    agent: AgentSection = Field(default_factory=AgentSection)
    detect: DetectSection = Field(default_factory=DetectSection)
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


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file; `ConfigError` lists every problem, one line each."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except PermissionError:
        raise ConfigError(f"{path}: permission denied: make it readable by the user running medic") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return parse_config(text, source=str(path))


def parse_config(text: str, source: str = "<config>") -> Config:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{where}: invalid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    return validate_config(data, source)


def validate_config(data: dict[str, Any], source: str = "<config>") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(err, source) for err in exc.errors())) from None


def _describe(err: Any, source: str) -> str:
    path = _key_path(err.get("loc", ()))
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return f"{source}: {path}: unknown key (check the spelling; see examples/medic.yaml)"
    message = err.get("msg", "invalid value")
    message = message.removeprefix("Value error, ")
    got = err.get("input")
    quiet = kind == "missing" or isinstance(got, (dict, list)) or "got " in message
    shown = "" if quiet else f" (got {got!r})"
    return f"{source}: {path or '<top>'}: {message}{shown}"


def _key_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-", "literal[", "constrained-")) or "[" in str(part):
            continue  # pydantic's union-branch markers are noise for a user
        else:
            out += f".{part}" if out else str(part)
    return out


def dump_config(config: Config) -> str:
    """The effective config as YAML, with durations in seconds and sizes in bytes."""
    return yaml.safe_dump(config.model_dump(mode="json", by_alias=True), sort_keys=False)
