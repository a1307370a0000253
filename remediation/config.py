"""The `remediation:` section of medic's config, validated on load (pydantic, unknown keys refused).

    remediation:
      mode: dry-run                      # off | dry-run | enforce
      budget: {max_concurrent: 1, min_interval: 10m, max_per_hour: 6, cooldown: 1h}
      plan: {safety_margin: 1h, restart_duration: 5m}
      coordinator: {backend: local}      # or etcd: {endpoints: [http://10.0.0.5:2379]}
      windows: [{days: mon-fri, start: "02:00", end: "06:00", timezone: Europe/Paris}]

`examples/remediation.yaml` shows every key with its default. Conversions to the engine's plain
settings (`limits()`, `plan_settings()`, ...) live here so the engine never reads raw config.
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Annotated, Literal, TypeVar

from pydantic import Field, PrivateAttr, field_validator, model_validator

from agent.core.patterns import compile_pattern
from agent.core.timescale import EVIDENCE_SAMPLES, RECHECK_SAMPLES, TimeScale
from agent.core.types import (
    DAY,
    HOUR,
    Duration,
    Interval,
    PositiveDuration,
    Size,
    Strict,
    Timeout,
    size_within,
    within,
)
from remediation.budget import BudgetLimits
from remediation.coordinator.etcd_security import EtcdAuthSection, EtcdTlsSection
from remediation.planner import PlanSettings
from remediation.policy import LadderSettings
from remediation.windows import TimeWindow, Windows, parse_days

_Section = TypeVar("_Section", bound=Strict)
TEMPLATE_FIELDS = frozenset({"instance", "pid", "fleet", "finding_id", "kind"})
KUBERNETES_NOT_YET = (
    "the kubernetes backend (Lease objects + the Eviction API honouring PodDisruptionBudgets) is designed "
    "in docs/remediation.md but not implemented yet; use backend: etcd (several hosts) or local (one host)"
)


def _check_template(value: str) -> str:
    """`{instance}`-style placeholders only; literal braces must be doubled."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
    except ValueError as exc:
        raise ValueError(
            f"bad placeholder in {value!r}: {exc}; write literal braces as {{{{ and }}}}"
        ) from None
    unknown = names - TEMPLATE_FIELDS
    if unknown:
        raise ValueError(
            f"unknown placeholder(s) {', '.join(sorted('{' + n + '}' for n in unknown))} in {value!r}; "
            f"known: {', '.join(sorted('{' + n + '}' for n in TEMPLATE_FIELDS))}"
        )
    return value


def _check_url(value: str) -> str:
    if not re.match(r"^https?://[^/\s]+", value):
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
    return _check_template(value)


# ----------------------------------------------------------------------------- budget, plan, ladder
Span = Annotated[Duration, within(0, 7 * DAY)]  # a wait or a window the engine keeps in mind: up to a week


class BudgetSection(Strict):
    max_concurrent: int = Field(1, ge=1, le=1000)
    min_interval: Annotated[Duration, within(0, DAY)] = 600.0
    max_per_hour: int | None = Field(6, ge=1, le=3600)
    cooldown: Span = 3600.0


class PlanSection(Strict):
    safety_margin: Span = 3600.0
    restart_duration: Annotated[
        Duration, within(0, DAY, above=True, why="how long one restart holds its slot")
    ] = 300.0
    deadline_granularity: Annotated[Duration, within(0, DAY)] = 300.0


class CrashLoopSection(Strict):
    max_restarts: int = Field(3, ge=1, le=1000)  # short-lived processes (crashes) within `window`
    window: Span = 3600.0
    reset_after: Span = 1800.0  # a process that stayed up this long ends the run


class LadderSection(Strict):
    purge_settle: Annotated[Duration, within(0, DAY)] = 120.0
    slow_confirm: Annotated[Duration, within(0, DAY)] = 120.0
    clear_check: Annotated[Duration, within(0, DAY)] = 600.0
    crash_loop: CrashLoopSection = Field(default_factory=CrashLoopSection)
    # an escalation ends by itself this long after it was raised; None: only a person ends it
    # (`medic clear NAME`), or, for escalations other than crash loops, the end of their finding
    escalation_expiry: Annotated[Duration, within(0, 30 * DAY, above=True)] | None = None


# ----------------------------------------------------------------------------- coordinator
class LocalCoordinatorSection(Strict):
    path: Path | None = None  # default: <state_dir>/coordinator.db (share a directory to share a budget)


class EtcdCoordinatorSection(Strict):
    endpoints: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:2379"], min_length=1)
    prefix: str = "/medic"
    tls: EtcdTlsSection | None = None  # https endpoints: {ca_file, cert_file, key_file}
    auth: EtcdAuthSection | None = None  # etcd user: {username, password_file}

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not re.match(r"^https?://[^/\s]+/?$", url):
                raise ValueError(f"expected endpoints such as http://127.0.0.1:2379, got {url!r}")
        return [url.rstrip("/") for url in value]

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value.startswith("/") or value.endswith("/") or len(value) < 2:
            raise ValueError(
                f"expected a key prefix such as /medic (leading /, no trailing /), got {value!r}"
            )
        return value


Ttl = Annotated[Duration, within(2, HOUR, why="etcd's minimum lease TTL is 2s")]


class CoordinatorSection(Strict):
    backend: Literal["local", "etcd", "kubernetes"] = "local"
    namespace: str = "default"  # agents with the same namespace share one budget and one plan
    lease_ttl: Ttl = 30.0  # a dead agent's restart slot frees itself after this
    fleet_ttl: Ttl = 60.0  # a dead agent's published instances vanish after this
    timeout: Annotated[Duration, within(0, 60, above=True)] = 2.0  # slower: unreachable, no restart
    local: LocalCoordinatorSection = Field(default_factory=LocalCoordinatorSection)
    etcd: EtcdCoordinatorSection = Field(default_factory=EtcdCoordinatorSection)

    @field_validator("backend")
    @classmethod
    def _exists(cls, value: str) -> str:
        if value == "kubernetes":
            raise ValueError(KUBERNETES_NOT_YET)
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", value):
            raise ValueError("expected letters, digits, '.', '_' or '-' (at most 63)")
        return value


# ----------------------------------------------------------------------------- blockers, windows
class WindowSection(Strict):
    days: str | list[str] | None = None  # mon-fri, "sat,sun", [mon, wed]; default every day
    start: str
    end: str
    timezone: str = "UTC"

    @model_validator(mode="after")
    def _parse(self) -> WindowSection:
        self.window()
        return self

    def window(self) -> TimeWindow:
        return TimeWindow.parse(self.start, self.end, self.days, self.timezone)

    @field_validator("days")
    @classmethod
    def _days(cls, value: str | list[str] | None) -> str | list[str] | None:
        parse_days(value)
        return value


class PrometheusBlockerSection(Strict):
    url: str  # e.g. http://prometheus:9090; medic reads <url>/api/v1/alerts
    match: list[str] = Field(default_factory=list)  # alertname regexes that block; empty: any alert
    ignore: list[str] = Field(default_factory=list)  # alertname regexes that never block
    timeout: Timeout = 5.0

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_url(value).rstrip("/")

    @field_validator("match", "ignore")
    @classmethod
    def _regexes(cls, value: list[str]) -> list[str]:
        for pattern in value:
            compile_pattern(pattern)  # PatternError (a ValueError) says what RE2 cannot take
        return value


class CapacityBlockerSection(Strict):
    # instances of a fleet down at once, the one restarted included
    max_unavailable: int = Field(1, ge=1, le=10_000)
    min_ready_fraction: float | None = Field(None, ge=0.0, le=1.0)


class BlockersSection(Strict):
    min_uptime: Span = 600.0
    capacity: CapacityBlockerSection = Field(default_factory=CapacityBlockerSection)
    prometheus: PrometheusBlockerSection | None = None


# ----------------------------------------------------------------------------- evidence, actuators
class EvidenceSection(Strict):
    enabled: bool = True
    dir: Path | None = None  # default: <state_dir>/evidence
    timeout: Timeout = 30.0
    max_bytes: Annotated[Size, size_within(0, 64 * 2**30)] = 64 * 2**20
    keep: int = Field(5, ge=1, le=1000)  # last N restarts' evidence per instance


class DrainSection(Strict):
    http: str | None = None  # POSTed before the restart
    command: list[str] | None = None  # or run (argv, no shell)
    timeout: Timeout = 30.0
    # wait this long after, for in-flight requests to finish
    settle: Annotated[Duration, within(0, HOUR)] = 0.0

    @model_validator(mode="after")
    def _one(self) -> DrainSection:
        if (self.http is None) == (self.command is None):
            raise ValueError("give exactly one of http (a URL to POST) or command (an argv list)")
        if self.http is not None:
            _check_url(self.http)
        if self.command is not None:
            if not self.command:
                raise ValueError("command must not be empty")
            for arg in self.command:
                _check_template(arg)
        return self


WARMUP_FORM = "warmup: {requests: DIR, target: 250ms, consecutive: 5, deadline: 2m}"


class WarmupSection(Strict):
    """Replay `requests` to the new process until `consecutive` answer within `target` in a row."""

    requests: Path  # a directory of .http request files or bodies to POST (`medic warmup --help`)
    url: str | None = None  # default: the instance's latency.canary.url, else its latency.prometheus origin
    target: Annotated[Duration, within(0, 600, above=True)] | None = None  # default: latency.slo.threshold
    consecutive: int = Field(5, ge=1, le=10_000)
    deadline: Annotated[Duration, within(0, DAY, above=True)] = 120.0
    timeout: Timeout = 5.0  # of one request
    # not warm by the deadline: `escalate` (the restart counts as failed) or `release` (the slot is
    # released with a warning event: the instance serves, slowly)
    on_cold: Literal["escalate", "release"] = "escalate"

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value)


class VerifySection(Strict):
    timeout: Annotated[Duration, within(0, DAY, above=True)] = 300.0  # the slot is held this long at most
    stable_for: Annotated[Duration, within(0, HOUR)] = 5.0  # the new process must stay up this long
    health_url: str | None = None  # must answer 2xx
    warmup: WarmupSection | None = None  # hold the slot until the new process is warm

    @field_validator("health_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value)

    @field_validator("warmup", mode="before")
    @classmethod
    def _warmup_form(cls, value: object) -> object:
        if value is True:
            raise ValueError(
                f"`warmup: true` names no requests to replay; give them: {WARMUP_FORM} "
                "(target defaults to the instance's latency.slo threshold)"
            )
        return None if value is False else value


class SignalActuatorSection(Strict):
    type: Literal["signal"]
    signal: Literal["TERM", "INT", "HUP", "QUIT", "USR1", "USR2"] = "TERM"
    grace: Annotated[Duration, within(0, HOUR)] = 30.0  # then KILL
    kill: bool = True
    start_timeout: Timeout = 120.0  # for the supervisor to bring a new process up


class ExecActuatorSection(Strict):
    type: Literal["exec"]
    command: list[str] = Field(min_length=1)  # argv, placeholders {instance} {pid} {fleet}
    timeout: Timeout = 120.0
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("command")
    @classmethod
    def _templates(cls, value: list[str]) -> list[str]:
        for arg in value:
            _check_template(arg)
        return value


class ManagedActuatorSection(Strict):
    type: Literal["managed"]
    timeout: Timeout = 60.0


class HttpActuatorSection(Strict):
    type: Literal["http"]
    url: str
    method: Literal["POST", "PUT"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: Timeout = 30.0

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_url(value)


ActuatorSection = Annotated[
    SignalActuatorSection | ExecActuatorSection | ManagedActuatorSection | HttpActuatorSection,
    Field(discriminator="type"),
]


class InstanceRemediationSection(Strict):
    actuator: ActuatorSection | None = None
    drain: DrainSection | None = None
    verify: VerifySection | None = None
    exclude: bool = False


# ----------------------------------------------------------------------------- the section
class RemediationSection(Strict):
    mode: Literal["off", "dry-run", "enforce"] = "dry-run"
    interval: Interval = 10.0  # how often the runtime calls Engine.step
    exclude: list[str] = Field(default_factory=list)  # instance names never remedied
    budget: BudgetSection = Field(default_factory=BudgetSection)
    plan: PlanSection = Field(default_factory=PlanSection)
    ladder: LadderSection = Field(default_factory=LadderSection)
    coordinator: CoordinatorSection = Field(default_factory=CoordinatorSection)
    blockers: BlockersSection = Field(default_factory=BlockersSection)
    windows: list[WindowSection] = Field(default_factory=list)  # empty: any time
    evidence: EvidenceSection = Field(default_factory=EvidenceSection)
    actuator: ActuatorSection | None = None  # default: managed for `command:` instances, else signal
    drain: DrainSection | None = None
    verify: VerifySection = Field(default_factory=VerifySection)
    instances: dict[str, InstanceRemediationSection] = Field(default_factory=dict)  # per-instance overrides
    retention: PositiveDuration = 30 * 86400.0  # ledger decisions and closed cases
    _scale: TimeScale = PrivateAttr(default_factory=TimeScale)  # the axis of `scaled()`

    def scaled(self, scale: TimeScale) -> RemediationSection:
        """This section on the agent's time scale (`agent.time_scale`, docs/detection.md): what the
        engine judges or waits by divided by it, a wait before a finding is judged again held at the
        samples that judgement needs, `restart_duration` at `verify.stable_for` (the least a restart
        takes); what runs in real time (a restart's own timeouts, leases, the schedule) as written."""
        if not scale.compressed:
            return self
        span, b, p, lad = scale.span, self.budget, self.plan, self.ladder
        settle = scale.samples(EVIDENCE_SAMPLES)
        section = _with(
            self,
            budget=_with(b, min_interval=span(b.min_interval), cooldown=span(b.cooldown)),
            plan=_with(
                p,
                safety_margin=span(p.safety_margin),
                restart_duration=span(p.restart_duration, self.verify.stable_for),
                deadline_granularity=span(p.deadline_granularity),
            ),
            ladder=_with(
                lad,
                purge_settle=span(lad.purge_settle, settle),
                slow_confirm=span(lad.slow_confirm, settle),
                clear_check=span(lad.clear_check, scale.samples(RECHECK_SAMPLES)),
                escalation_expiry=scale.optional(lad.escalation_expiry),
                crash_loop=_with(
                    lad.crash_loop,
                    window=span(lad.crash_loop.window),
                    reset_after=span(lad.crash_loop.reset_after),
                ),
            ),
            blockers=_with(self.blockers, min_uptime=span(self.blockers.min_uptime)),
        )
        section._scale = scale
        return section

    def limits(self) -> BudgetLimits:
        b = self.budget
        return BudgetLimits(
            b.max_concurrent, b.min_interval, b.max_per_hour, b.cooldown, self._scale.span(HOUR)
        )

    def plan_settings(self) -> PlanSettings:
        p = self.plan
        return PlanSettings(p.safety_margin, p.restart_duration, p.deadline_granularity)

    def ladder_settings(self) -> LadderSettings:
        lad, loop = self.ladder, self.ladder.crash_loop
        return LadderSettings(
            lad.purge_settle,
            lad.slow_confirm,
            lad.clear_check,
            loop.max_restarts,
            loop.window,
            loop.reset_after,
        )

    def time_windows(self) -> Windows:
        return Windows(w.window() for w in self.windows)

    def for_instance(self, name: str) -> InstanceRemediationSection:
        return self.instances.get(name) or InstanceRemediationSection()

    def excluded(self, name: str) -> bool:
        return name in self.exclude or self.for_instance(name).exclude


def _with(section: _Section, **changes: object) -> _Section:
    return section.model_copy(update=changes)
