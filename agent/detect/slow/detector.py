"""The slow detector: is an instance's latency over its SLO, far above its peers', or degrading?

Entry point, mirroring the memory detectors' `evaluate`:

    evaluate_slow(fleet, now, params=DEFAULT_SLOW, slos={name: Slo}, remote_peers={name: seconds})
        -> list[Observation]          # one of kind "slow" per instance of `fleet`

`fleet` is the `InstanceSeries` of the instances that are peers of one another (one fleet label
on this agent); `remote_peers` adds the levels (median p99 over `peer_window`) of peers on
other hosts, from the Prometheus query API or the coordinator. Peers are compared on the same
figure only: a p99 with p99s, a mean (a summary without quantiles, a pair of counters) with means. Feed the observations to
`agent.detect.lifecycle.update(active, observations, params)`: `SlowParams` has the
`open_after`/`resolve_after` it reads.

Rules (`agent.detect.slow.rules`), each with separate firing and clearing thresholds so that
findings do not flap:
- **slo**: the SLO quantile over its threshold for `fire_fraction` of the SLO's `for` window;
- **peer**: a robust outlier (median/MAD, at least `peer_min` peers, a ratio and a floor);
- **trend**: steady growth by the memory detectors' trend test, reaching the SLO within `horizon`.
The observation fires when any rule fires, clears when every rule that could judge clears, and
holds otherwise. Evidence names each rule's state and figures; CPU throttling, memory pressure,
memory near its limit and major faults are attached as likely causes (`agent.detect.slow.causes`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from agent.core.timescale import WINDOW_SAMPLES, TimeScale
from agent.detect.model import START_TIME, InstanceSeries, Observation, State
from agent.detect.slow.causes import likely_causes
from agent.detect.slow.relative import (
    RatioAt,
    judge_relative,
    ratio_lately,
    relative_instants,
    relative_ratios,
    steadied,
    usual_ratio,
)
from agent.detect.slow.rules import (
    CANARY,
    MEAN,
    QUANTILE_METRICS,
    RELATIVE_POINTS,
    LatencyView,
    Rule,
    Slo,
    SlowParams,
    judge_peer,
    judge_slo,
    judge_trend,
)

if TYPE_CHECKING:
    from agent.core.types import Kind, Severity

__all__ = [
    "CAUSE_METRICS",
    "DEFAULT_SLOW",
    "INPUT_METRICS",
    "KIND",
    "LATENCY_METRICS",
    "QUANTILE_METRICS",
    "Level",
    "Slo",
    "SlowParams",
    "causes_history",
    "evaluate_slow",
    "fleets",
    "history",
    "judge_view",
    "slo_from_settings",
    "tick_for",
]

KIND: Kind = "slow"
DEFAULT_SLOW = SlowParams()
LATENCY_METRICS = (*QUANTILE_METRICS.values(), MEAN, CANARY)  # each instance judges the first it has
# what likely causes are read from, over `causes_history` (far shorter than the latency's `history`)
CAUSE_METRICS = (
    "cgroup_cpu_periods_total",
    "cgroup_cpu_throttled_periods_total",
    "cgroup_cpu_throttled_seconds_total",
    "cgroup_memory_pressure_some_seconds_total",
    "rss_bytes",
    "memory_limit_bytes",
    "major_faults_total",
)
# the series `evaluate_slow` reads: load these from the store for each instance
INPUT_METRICS = (*LATENCY_METRICS, START_TIME, *CAUSE_METRICS)


def history(params: SlowParams = DEFAULT_SLOW, slos: Mapping[str, Slo | None] | None = None) -> float:
    """Seconds of samples before `now` that `evaluate_slow` needs to judge like a full replay."""
    windows = [
        params.peer_window + params.relative_reach,
        params.trend_window,
        *(slo.window for slo in (slos or {}).values() if slo),
    ]
    return max(windows) + params.stale + params.step


def causes_window(params: SlowParams, slo: Slo | None) -> float:
    """The span before a judgement over which its likely causes are read: the SLO's `for` or the
    peer window, the longer."""
    return max(slo.window if slo else 0.0, params.peer_window)


def causes_history(params: SlowParams = DEFAULT_SLOW, slos: Mapping[str, Slo | None] | None = None) -> float:
    """Seconds of the likely causes' series (`CAUSE_METRICS`) before `now` that `evaluate_slow`
    reads: far less than the latency's `history`."""
    windows = [causes_window(params, slo) for slo in (slos or {}).values()] or [causes_window(params, None)]
    return max(windows) + params.stale + params.step


def judged_reach(params: SlowParams = DEFAULT_SLOW, slos: Mapping[str, Slo | None] | None = None) -> float:
    """How far back a judgement that is not "unknown" must find a sample: its rules' windows; the
    relative rule needs its own level at all but `RELATIVE_POINTS * (1 - min_coverage)` of its
    instants, so the newest of them it cannot do without is that many spacings back."""
    spare = RELATIVE_POINTS - math.ceil(params.min_coverage * RELATIVE_POINTS - 1e-9)
    relative = params.peer_window + spare * params.relative_spacing
    windows = [
        params.peer_window,
        params.trend_window,
        relative,
        *(s.window for s in (slos or {}).values() if s),
    ]
    return max(windows) + params.stale + params.step


def slo_from_settings(settings: Mapping[str, Any] | None, scale: TimeScale | float = 1.0) -> Slo | None:
    """The SLO in an instance's config as plain data (`latency.slo`), or None when it has none. Its
    `for` is a detection window: on the agent's time scale, held at `WINDOW_SAMPLES` probe intervals
    as the peer window is (`agent.core.timescale`)."""
    latency = (settings or {}).get("latency")
    slo = latency.get("slo") if isinstance(latency, Mapping) else None
    if not isinstance(slo, Mapping):
        return None
    axis = TimeScale.of(scale)
    window = axis.span(float(slo.get("for", slo.get("for_", 300.0))), axis.samples(WINDOW_SAMPLES))
    return Slo(float(slo.get("quantile", 0.99)), float(slo.get("threshold", 0.25)), window)


def tick_for(now: float, params: SlowParams) -> float:
    """The judgement instant for `now`: the last step boundary at or before it."""
    return math.floor(now / params.step + 1e-9) * params.step


def evaluate_slow(
    fleet: Sequence[InstanceSeries],
    now: float,
    params: SlowParams = DEFAULT_SLOW,
    *,
    slos: Mapping[str, Slo | None] | None = None,
    remote_peers: Mapping[str, float] | None = None,
) -> list[Observation]:
    """One judgement of every instance of one fleet at `now` (samples up to the step boundary)."""
    tick = tick_for(now, params)
    slos = slos or {}
    views = [LatencyView.at(series, tick, slos.get(series.instance)) for series in fleet]
    levels = {view.instance: view.level(params.peer_window, tick, params) for view in views}
    known = {
        view.instance: Level(level, view.metric)
        for view in views
        if (level := levels[view.instance]) is not None
    }
    remote = QUANTILE_METRICS[0.99]
    known.update(
        {f"remote:{k}": Level(float(v), remote) for k, v in (remote_peers or {}).items() if math.isfinite(v)}
    )
    instants = relative_instants(tick, params)
    past = [  # each instance's level at each earlier instant, as that judgement saw it
        {
            view.instance: Level(level, view.metric)
            for view in (
                LatencyView.at(series, at, slos.get(series.instance), at - params.peer_window - params.stale)
                for series in fleet
            )
            if (level := view.level(params.peer_window, at, params)) is not None
        }
        for at in instants[:-1]
    ]
    local = {name: level for name, level in known.items() if not name.startswith("remote:")}
    return [
        judge_view(
            view,
            levels[view.instance],
            known,
            tick,
            params,
            relative_ratios(view.instance, [*past, local], view.lifetime_start, instants, params.peer_min),
        )
        for view in views
    ]


class Level(NamedTuple):
    """A peer's level (median latency over the peer window) and the series it was read from."""

    seconds: float
    metric: str | None


def judge_view(
    view: LatencyView,
    level: float | None,
    known: Mapping[str, Level],
    tick: float,
    params: SlowParams,
    ratios: Sequence[RatioAt] = (),
) -> Observation:
    """One instance's judgement at `tick`: its `level` against the `known` levels of its fleet read
    from the same series as its own (its own left out), its SLO, its trend, and its level over its
    local peers' at the instants of `relative_instants` (`ratios`, from `relative_ratios`). Where
    peers can tell, a trend that they share (the fleet's traffic rising) is not this instance being
    slow: it only holds. The peer rule reads where the instance usually sits among its peers as it
    is; the relative rule, its ratios set to the fleet's usual level (`steadied`)."""
    peers = {
        name: peer.seconds
        for name, peer in known.items()
        if name != view.instance and peer.metric == view.metric
    }
    usual = usual_ratio(ratios, tick, params)
    steady, elasticity = steadied(ratios, tick, params)
    relative = judge_relative(view, steady, tick, params, usual_ratio(steady, tick, params), elasticity)
    trend = judge_trend(view, tick, params)
    if trend.state == "firing" and relative.state == "clear":
        trend = Rule("holding", trend.summary + "; its peers rose alike", trend.figures)
    rules = {
        "slo": judge_slo(view, tick, params),
        "peer": judge_peer(view, level, peers, params, usual, ratio_lately(ratios, tick, params)),
        "trend": trend,
        "relative": relative,
    }
    return _observation(view, tick, rules, params)


def _observation(view: LatencyView, tick: float, rules: dict[str, Rule], params: SlowParams) -> Observation:
    judged = [rule.state for rule in rules.values() if rule.state != "unknown"]
    fired = [name for name, rule in rules.items() if rule.state == "firing"]
    state: State = (
        "firing" if fired else "holding" if "holding" in judged else "clear" if judged else "unknown"
    )
    evidence: dict[str, Any] = {
        "metric": view.metric,
        "fired": fired,
        "rules": {name: {"state": r.state, "summary": r.summary, **r.figures} for name, r in rules.items()},
    }
    severity: Severity = "info"
    if state == "unknown":
        why = "; ".join(f"{name}: {rule.summary}" for name, rule in rules.items())
        if view.metric is None:
            why = "no latency data (configure latency.prometheus or latency.canary)"
        summary = f"{view.instance}: cannot judge latency: {why}"
    elif fired:
        summary = f"{view.instance} is slow: " + "; ".join(
            f"{rules[name].summary} [{name}]" for name in fired
        )
        severity = "error" if "slo" in fired or len(fired) > 1 else "warning"
    elif state == "holding":
        held = [name for name, rule in rules.items() if rule.state == "holding"]
        summary = f"{view.instance}: latency near a slow threshold: " + "; ".join(
            rules[n].summary for n in held
        )
    else:
        summary = f"{view.instance}: latency within its SLO and in line with its peers"
    if state in ("firing", "holding"):
        causes = likely_causes(view.series, tick - causes_window(params, view.slo), tick, params)
        evidence["likely_causes"] = causes
        if causes and fired:
            summary += "; likely cause: " + ", ".join(cause["text"] for cause in causes)
    return Observation(
        instance=view.instance,
        kind=KIND,
        state=state,
        tick=tick,
        lifetime_start=view.lifetime_start,
        summary=summary,
        severity=severity,
        evidence=evidence,
    )


def fleets(
    instances: Sequence[InstanceSeries], labels: Mapping[str, Mapping[str, str]]
) -> list[list[InstanceSeries]]:
    """Instances grouped into peer groups by their `fleet` label (unlabelled ones form one group)."""
    groups: dict[str, list[InstanceSeries]] = {}
    for series in instances:
        groups.setdefault(labels.get(series.instance, {}).get("fleet", ""), []).append(series)
    return [groups[key] for key in sorted(groups)]
