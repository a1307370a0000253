"""The two entry points: `evaluate` (one judgement, for the online path) and `analyze` (a replay).

Online, the agent calls `evaluate(series, now, params)` on a schedule with at least
`params.history` seconds of series, then `lifecycle.update(active, observations, params)`, and
records each transition as an event. Offline, `analyze` does exactly that at every tick of the
bucket grid, so `medic analyze` on a recording finds what the agent would have found, at the
same times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from agent.detect.coverage import Interval, seen_from, steps_seen
from agent.detect.lifecycle import update
from agent.detect.memory.context import Context, above_settled, oom_series
from agent.detect.memory.fragmentation import judge_fragmentation, note_both
from agent.detect.memory.growth import time_to_limit
from agent.detect.memory.leak import judge_leak, leak_series
from agent.detect.memory.lifetimes import ended_growing
from agent.detect.memory.oom import judge_oom, oom_peak
from agent.detect.memory.prepared import Prepared
from agent.detect.model import (
    ALLOCATED,
    JVM_HEAP_AFTER_GC,
    RSS,
    Finding,
    InstanceAnalysis,
    InstanceSeries,
    Observation,
)
from agent.detect.params import DetectParams

DEFAULT_PARAMS = DetectParams()


def tick_for(now: float, params: DetectParams) -> float:
    """The judgement instant for `now`: the last multiple of `params.step` at or before it."""
    return math.floor(now / params.step + 1e-9) * params.step


def evaluate(series: InstanceSeries, now: float, params: DetectParams = DEFAULT_PARAMS) -> list[Observation]:
    """Judge one instance at `now`: one observation per kind (leak, oom-risk, fragmentation).

    Uses only samples before the last bucket boundary; pass at least `params.history` of them
    (older ones are ignored) to get the same answer as a replay over the full history.
    """
    return judge(Prepared(series, params), tick_for(now, params))


def judge(prep: Prepared, tick: float, skip_quiet: bool = False) -> list[Observation]:
    """The observations at `tick`; with `skip_quiet`, none unless one of them fires (a replay with
    no active finding needs nothing else: clear, holding and unknown observations change nothing)."""
    ctx = Context.at(prep, tick)
    if ctx is None:
        return []
    if skip_quiet and _quiet(ctx):
        return []
    leak = judge_leak(ctx)
    oom = judge_oom(ctx)
    if skip_quiet and leak.state != "firing" and oom.state != "firing" and not _frag_inputs(ctx):
        return []
    frag = judge_fragmentation(ctx, leak)  # exclusive with the leak unless the evidence shows both
    note_both(leak, frag)
    if skip_quiet and leak.state != "firing" and oom.state != "firing" and frag.state != "firing":
        return []
    if oom.state in ("firing", "holding"):
        oom.verdict = leak.verdict if leak.state == "firing" else (frag.verdict or leak.verdict)
    return [leak, oom, frag]


def _frag_inputs(ctx: Context) -> bool:
    return ctx.present(ALLOCATED) or ctx.present(JVM_HEAP_AFTER_GC)


def _quiet(ctx: Context) -> bool:
    """True when no detector can fire; a cheap test that settles most judgements of healthy
    processes. Every condition is one that firing needs (leak or oom-risk): a fragmentation
    input is absent, and no fit grows with the confidence firing needs (the raw Mann-Kendall
    test first, the corrected one only if that passes) towards a limit it would reach within
    the horizon, unless the fit is a wider scale and the lifetime has run a whole period, the
    previous lifetime ended growing, or this one stays above the level the earlier ones settled
    at (`lifetimes`).
    With no limit known nothing reaches it: only the wider scales of a settled lifetime can fire
    (the fits are still made, as every judgement makes them: the long scale's cache fills at the
    same ticks)."""
    if _frag_inputs(ctx):
        return False
    p = ctx.params
    settled = ctx.tick - ctx.lifetime_start >= ctx.prep.settle(ctx.life)
    if any(above_settled(ctx, metric) is not None for metric in leak_series(ctx)):
        return False  # above the level the earlier lifetimes settled at (`lifetimes.outgrown`)
    for metric in {RSS, *leak_series(ctx), *oom_series(ctx)}:
        for fit in ctx.fits(metric):
            if fit.confidence < p.confidence or fit.trend.slope <= 0:
                continue
            limit = ctx.projection(metric).limit  # made once per metric, and only for a growing fit
            unlimited = limit is None
            strong = fit.trend.confidence >= p.confidence
            if fit.trend.confidence >= p.confidence_clear and ended_growing(ctx, metric) is not None:
                return False  # the previous lifetime's evidence may speak (`lifetimes.carried`)
            if unlimited and (not settled or fit.scale == "window"):
                continue  # no time to a limit, and no settled wider scale
            if strong and fit.scale != "window" and settled:
                return False
            ttoom = time_to_limit(limit, oom_peak(ctx, fit), fit.trend.slope)
            if ttoom is not None and ttoom < (p.horizon if strong else p.horizon / 4):
                return False
    return True


def judged_reach(params: DetectParams) -> tuple[float, float]:
    """How far before and after its instant a judgement may read samples, with a step to spare each
    way: every detector fits the last `window` of buckets, and answers "unknown" without them."""
    return params.window + 2 * params.step, params.step


def replay_steps(
    first: float, last: float, params: DetectParams, seen: Sequence[Interval], every_tick: bool = False
) -> Iterable[int]:
    """The step numbers a replay of samples from `first` to `last` judges: each whose instant
    `seen` covers (`agent.detect.coverage`), or every one with `every_tick`."""
    steps = range(math.floor(first / params.step) + 1, math.floor(last / params.step + 1e-9) + 1)
    return steps if every_tick else steps_seen(seen, params.step, steps.start, steps.stop - 1)


def analyze_instance(
    series: InstanceSeries, params: DetectParams = DEFAULT_PARAMS, every_tick: bool = False
) -> InstanceAnalysis:
    """Replay the online path over the whole of `series`, tick by tick; the ticks that see no sample
    are skipped (`agent.detect.coverage`) unless `every_tick` (the reference the skipping is held to)."""
    prep = Prepared(series, params)
    first, last = series.first_ts(), series.last_ts()
    out = InstanceAnalysis(series.instance, [], [], [], first, last, prep.starts[1:])
    if first is None or last is None:
        out.notes.append("no samples")
        return out
    width = params.step
    active: list[Finding] = []
    opened: dict[str, Finding] = {}
    observations: list[Observation] = []
    seen = seen_from(series.series.values(), *judged_reach(params))
    for k in replay_steps(first, last, params, seen, every_tick):
        observations = judge(prep, k * width, skip_quiet=not active)
        if not observations:
            continue
        active, transitions = update(active, observations, params)
        for tr in transitions:
            out.transitions.append(tr)
            opened[tr.finding.id] = tr.finding
            if tr.change == "opened":
                out.at_open[tr.finding.id] = tr.finding
    for finding in active:
        if finding.state == "open":
            opened[finding.id] = finding
    out.findings = sorted(opened.values(), key=lambda f: (f.opened_at or 0.0, f.kind))
    out.notes = sorted({f"{o.kind}: {o.summary}" for o in observations if o.state == "unknown"})
    return out


def analyze(
    all_series: Iterable[InstanceSeries],
    params: DetectParams = DEFAULT_PARAMS,
    progress: Callable[[int, int], None] | None = None,
) -> list[InstanceAnalysis]:
    """`analyze_instance` for each instance; `progress(done, total)` after each one."""
    items = list(all_series)
    results = []
    for i, series in enumerate(items, 1):
        results.append(analyze_instance(series, params))
        if progress is not None:
            progress(i, len(items))
    return results
