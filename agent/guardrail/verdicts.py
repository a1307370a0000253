"""The verdicts of one run, each with its evidence and a confidence.

- `leak`: medic's leak detector (`agent.detect`) on the run's compressed time scale
  (`agent.guardrail.growth`) fires on the candidate's live bytes (allocator `allocated` when both
  builds have the hook, else RSS), and the candidate grows faster than the baseline by `leak_rate`,
  and by `leak_margin` when both grow; and it still does in the last round and in every other round
  but one in four (a server's warm-up fills arenas and caches in the first seconds, both builds alike but
  not in step, and then stops).
- `fragmentation`: the detector fires on the candidate's RSS while its allocated bytes stay flat
  (grow at under a quarter of the RSS rate), by the same margins; needs allocator figures.
- `slower`: p50 or p99 worse by more than its threshold at the confidence asked: the one-sided
  lower bound of the paired time-block bootstrap of the quantile ratio (`agent.guardrail.stats`)
  above 1 + threshold. p99 counts only with `MIN_P99_REQUESTS` requests of each build.
- `cpu`: CPU seconds per request (process probe), the same test.
- `errors`: error ratio higher by more than `errors`, exact conditional binomial test.
- `peak-memory`: the candidate's peak RSS above the baseline's by `peak` and `peak_bytes`;
  the confidence is the share of rounds in which that holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from agent.core.units import format_bytes, format_duration
from agent.detect.model import ALLOCATED, RESIDENT, RSS
from agent.guardrail.driver import Record
from agent.guardrail.growth import MIN_POINTS, Growth, growth, judge_series, on_requests_clock
from agent.guardrail.measure import BuildSeries
from agent.guardrail.options import Thresholds
from agent.guardrail.stats import (
    Comparison,
    blocks_by_time,
    compare,
    more_errors_p,
    quantile,
    quantile_of_blocks,
    ratio_of_sums,
    time_edges,
)

FLAT_SHARE = 0.25  # allocated bytes growing at under this share of the RSS rate count as flat
MIN_P99_REQUESTS = 2000  # a p99 that stands on 20 requests of each build
NAMES = ("leak", "fragmentation", "slower", "cpu", "errors", "peak-memory")


@dataclass(slots=True)
class Verdict:
    name: str
    status: str  # "fail" (a regression), "pass", or "unknown" (could not judge: summary says why)
    summary: str
    confidence: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "confidence": None if self.confidence is None else round(self.confidence, 4),
            "evidence": self.evidence,
        }


@dataclass(slots=True)
class Measurement:
    """Everything the verdicts read: both builds' requests and samples over the measured rounds."""

    start: float  # unix seconds
    end: float
    rounds: list[tuple[float, float, int]]  # (start, end, which build went first)
    records: tuple[Record, Record]
    clock_offset: float  # unix - monotonic, to place request times on the samples' clock
    builds: tuple[BuildSeries, BuildSeries]
    limit: float
    server_latency: dict[str, dict[str, Any]] = field(default_factory=dict)


def _grows_more(cand: Growth, base: Growth | None, t: Thresholds) -> tuple[bool, float, str]:
    """Whether the candidate's growth is a regression against the baseline's, by how much, and
    what a pass says when only the rounds ruled it out (else "")."""
    base_slope = max(base.slope, 0.0) if base is not None else 0.0
    excess = cand.slope - base_slope
    if not cand.firing or excess < t.leak_rate:
        return False, excess, ""
    if base is not None and base.firing and cand.slope < (1 + t.leak_margin) * base.slope:
        return False, excess, ""
    if not holds_to_the_end(cand.per_round, base.per_round if base else [], t):
        return (
            False,
            excess,
            f" (grew early in the run only: {_per_min(cand.per_round[-1])} in its last round)",
        )
    return True, excess, ""


def holds_to_the_end(cand: list[float], base: list[float], t: Thresholds) -> bool:
    """Whether the candidate outgrows the baseline by `leak_rate` and `leak_margin` in every round but
    one in four, the last round always (true when there are no rounds to tell)."""
    base = base or [0.0] * len(cand)
    beyond = [
        c - max(b, 0.0) >= t.leak_rate and c >= (1 + t.leak_margin) * max(b, 0.0)
        for c, b in zip(cand, base, strict=True)
    ]
    return not beyond or (beyond[-1] and beyond.count(False) <= len(beyond) // 4)


def _pass_confidence(cand: Growth, excess: float, t: Thresholds) -> float:
    """How sure a pass is: 1 when the extra growth is under half the threshold, 0.75 under it,
    else 0.5 (growth is there, but the detector does not find it steady, or both builds grow alike)."""
    if excess < t.leak_rate / 2:
        return 1.0
    return 0.75 if excess < t.leak_rate else 0.5


def _per_min(rate: float) -> str:
    return f"{format_bytes(rate * 60)}/min"


def judge_leak(m: Measurement, t: Thresholds) -> Verdict:
    base_b, cand_b = m.builds
    hooked = bool(base_b.points(ALLOCATED)) and bool(cand_b.points(ALLOCATED))
    metric = ALLOCATED if hooked else RSS
    cand, base = (growth(b, metric, m.start, m.end, m.rounds) for b in (cand_b, base_b))
    if cand is None or base is None:
        return Verdict("leak", "unknown", f"too few {metric} samples to judge growth (need {MIN_POINTS})")
    failed, excess, early = _grows_more(cand, base, t)
    evidence: dict[str, Any] = {
        "candidate": cand.to_dict(),
        "baseline": base.to_dict(),
        "excess_bytes_per_second": excess,
    }
    if not hooked:
        evidence["note"] = (
            "judged on RSS: without allocator figures for both builds a leak cannot be told from fragmentation "
            "(start the servers with medic's hook or the LD_PRELOAD shim)"
        )
    rss_now = (cand_b.points(RSS) or [(0.0, 0.0)])[-1][1]
    if failed:
        to_limit = (m.limit - rss_now) / excess if excess > 0 and m.limit > rss_now else None
        evidence["time_to_limit_seconds"] = to_limit
        summary = (
            f"the candidate's {metric} grows {_per_min(cand.slope)} (baseline {_per_min(base.slope)}); "
            f"at that rate it reaches the {format_bytes(m.limit)} limit in {format_duration(to_limit)}"
        )
        return Verdict("leak", "fail", summary, cand.confidence, evidence)
    summary = f"no leak: the candidate's {metric} grows {_per_min(cand.slope)}, the baseline's {_per_min(base.slope)}"
    if early:
        summary += early
    elif cand.firing:
        summary += " (both grow alike)" if base.firing else f" (under the {_per_min(t.leak_rate)} threshold)"
    return Verdict("leak", "pass", summary, _pass_confidence(cand, excess, t), evidence)


def judge_fragmentation(m: Measurement, t: Thresholds, leak: Verdict) -> Verdict:
    base_b, cand_b = m.builds
    if not cand_b.points(ALLOCATED):
        why = cand_b.allocator or "no allocator figures"
        return Verdict("fragmentation", "unknown", f"cannot tell RSS growth from live growth: {why}")
    rss = growth(cand_b, RSS, m.start, m.end, m.rounds)
    live = growth(cand_b, ALLOCATED, m.start, m.end, m.rounds)
    base_rss = growth(base_b, RSS, m.start, m.end, m.rounds)
    if rss is None or live is None:
        return Verdict("fragmentation", "unknown", f"too few samples to judge growth (need {MIN_POINTS})")
    evidence: dict[str, Any] = {
        "candidate_rss": rss.to_dict(),
        "candidate_allocated": live.to_dict(),
        "baseline_rss": base_rss.to_dict() if base_rss else None,
    }
    flat = not live.firing or live.slope < FLAT_SHARE * rss.slope
    grows, excess, early = _grows_more(rss, base_rss, t)
    observed = judge_series(
        {
            k: on_requests_clock(cand_b, cand_b.points(k), m.start, m.end)
            for k in (RSS, ALLOCATED, RESIDENT)
            if cand_b.points(k)
        },
        m.start,
        m.end,
    )
    frag = next((o for o in observed if o.kind == "fragmentation"), None)
    if frag is not None:
        evidence["detector"] = {
            "state": frag.state,
            "verdict": frag.verdict,
            "summary": frag.summary,
            **frag.evidence,
        }
    if grows and flat and not leak.failed:
        kind = (
            "allocator retention"
            if frag is not None and frag.verdict == "allocator-retention"
            else "fragmentation"
        )
        summary = (
            f"{kind}: the candidate's RSS grows {_per_min(rss.slope)} while its allocated bytes grow "
            f"{_per_min(live.slope)}: memory kept by the allocator, not live objects"
        )
        if frag is not None and frag.evidence.get("advice"):
            summary += f"; {frag.evidence['advice']}"
        return Verdict("fragmentation", "fail", summary, rss.confidence, evidence)
    if grows and not flat:
        summary = "RSS grows with the allocated bytes: that is the leak verdict's, not fragmentation"
    else:
        summary = f"no fragmentation: the candidate's RSS grows {_per_min(rss.slope)}"
        if base_rss is not None:
            summary += f", the baseline's {_per_min(base_rss.slope)}"
        summary += early
    return Verdict("fragmentation", "pass", summary, _pass_confidence(rss, excess, t), evidence)


def _block_count(n: int) -> int:
    return max(10, min(60, n // 25))


def _latency_blocks(m: Measurement, count: int) -> tuple[list[list[float]], list[list[float]]]:
    edges = time_edges(m.start, m.end, count)
    out = []
    for record in m.records:
        times = [s + m.clock_offset for s, ok in zip(record.sent, record.ok, strict=True) if ok]
        values = [v for v, ok in zip(record.latency, record.ok, strict=True) if ok]
        out.append(blocks_by_time(times, values, edges))
    return out[0], out[1]


def judge_slower(m: Measurement, t: Thresholds, resamples: int, seed: int) -> Verdict:
    n = min(sum(m.records[0].ok), sum(m.records[1].ok))
    if n < 20:
        return Verdict("slower", "unknown", f"too few answered requests to compare latency ({n}; need 20)")
    base, cand = _latency_blocks(m, _block_count(n))
    found: dict[str, Comparison] = {}
    for q, threshold in ((0.5, t.slower_p50), (0.9, t.slower_p99), (0.99, t.slower_p99)):
        found[f"p{round(q * 100)}"] = compare(
            base,
            cand,
            quantile_of_blocks(q),
            threshold=threshold,
            confidence=t.confidence,
            resamples=resamples,
            seed=seed,
        )
    evidence: dict[str, Any] = {k: c.to_dict() for k, c in found.items()}
    evidence["blocks"] = len(base)
    if m.server_latency:
        evidence["server_histogram"] = m.server_latency
    judged = [("p50", t.slower_p50)] + ([("p99", t.slower_p99)] if n >= MIN_P99_REQUESTS else [])
    failing = [(k, thr) for k, thr in judged if found[k].low > 1 + thr]
    p50, p99 = found["p50"], found["p99"]
    shown = (
        f"p50 {p50.candidate * 1000:.2f} ms vs {p50.baseline * 1000:.2f} ms ({p50.ratio - 1:+.1%}), "
        f"p99 {p99.candidate * 1000:.2f} ms vs {p99.baseline * 1000:.2f} ms ({p99.ratio - 1:+.1%})"
    )
    if n < MIN_P99_REQUESTS:
        shown += f" (p99 shown, not judged: {n} requests, {MIN_P99_REQUESTS} needed)"
        evidence["p99_judged"] = False
    if failing:
        worst = max(failing, key=lambda kv: found[kv[0]].above_threshold)
        c = found[worst[0]]
        summary = (
            f"slower: {shown}; {worst[0]} at least {c.low - 1:+.1%} at {t.confidence:.0%} confidence "
            f"(threshold {worst[1]:.0%})"
        )
        return Verdict("slower", "fail", summary, c.above_threshold, evidence)
    confidence = 1 - max(found[k].above_threshold for k, _ in judged)
    over = [(k, thr) for k, thr in judged if found[k].ratio > 1 + thr]
    if over:
        evidence["inconclusive"] = [k for k, _ in over]
        k, thr = over[0]
        summary = f"not shown slower: {shown}; {too_noisy(k, found[k], thr, t.confidence)}"
        return Verdict("slower", "pass", summary, confidence, evidence)
    return Verdict("slower", "pass", f"not slower: {shown}", confidence, evidence)


def too_noisy(name: str, c: Comparison, threshold: float, confidence: float) -> str:
    """What a pass says when the measured ratio is over its threshold but the confidence bound is not:
    "alike" or "not slower" would read as a measurement that showed nothing."""
    return (
        f"{name} is over its {threshold:.0%} threshold but only {c.low - 1:+.1%} at {confidence:.0%} "
        "confidence: too noisy to tell, run longer or at a higher rate"
    )


def _cpu_blocks(m: Measurement, count: int) -> tuple[list[list[float]], list[list[float]]] | None:
    """Per time block: [CPU seconds, requests answered], from consecutive samples of each build."""
    edges = time_edges(m.start, m.end, count)
    out = []
    for build in m.builds:
        cpu = build.points("cpu_seconds_total")
        answered = dict(build.answered)
        pairs = [(t, v, answered.get(t)) for t, v in cpu if t in answered]
        if len(pairs) < 3:
            return None
        blocks = [[0.0, 0.0] for _ in range(count)]
        for (t0, c0, a0), (t1, c1, a1) in pairwise(pairs):
            if a0 is None or a1 is None:
                continue
            i = min(count - 1, max(0, int((0.5 * (t0 + t1) - edges[0]) // ((edges[-1] - edges[0]) / count))))
            blocks[i][0] += max(0.0, c1 - c0)
            blocks[i][1] += max(0, a1 - a0)
        out.append([b if b[1] > 0 else [] for b in blocks])
    return out[0], out[1]


def judge_cpu(m: Measurement, t: Thresholds, resamples: int, seed: int) -> Verdict:
    count = max(6, min(40, len(m.builds[0].points("cpu_seconds_total")) // 4))
    blocks = _cpu_blocks(m, count)
    if blocks is None:
        return Verdict("cpu", "unknown", "too few CPU samples to compare CPU seconds per request")
    c = compare(
        *blocks, ratio_of_sums, threshold=t.cpu, confidence=t.confidence, resamples=resamples, seed=seed
    )
    if not (math.isfinite(c.baseline) and math.isfinite(c.candidate)):
        return Verdict("cpu", "unknown", "no requests answered: CPU per request unknown")
    shown = (
        f"{c.candidate * 1000:.2f} ms vs {c.baseline * 1000:.2f} ms of CPU per request ({c.ratio - 1:+.1%})"
    )
    evidence: dict[str, Any] = c.to_dict() | {"blocks": count}
    if c.low > 1 + t.cpu:
        return Verdict("cpu", "fail", f"more CPU per request: {shown}", c.above_threshold, evidence)
    if c.ratio > 1 + t.cpu:
        evidence["inconclusive"] = ["cpu"]
        summary = (
            f"not shown to use more CPU: {shown}; {too_noisy('CPU per request', c, t.cpu, t.confidence)}"
        )
        return Verdict("cpu", "pass", summary, 1 - c.above_threshold, evidence)
    return Verdict("cpu", "pass", f"CPU per request alike: {shown}", 1 - c.above_threshold, evidence)


def judge_errors(m: Measurement, t: Thresholds) -> Verdict:
    base, cand = m.records
    b_err, c_err = base.failures, cand.failures
    b_n, c_n = base.count, cand.count
    if not b_n or not c_n:
        return Verdict("errors", "unknown", "no requests were sent")
    b_ratio, c_ratio = b_err / b_n, c_err / c_n
    p = more_errors_p(b_err, b_n, c_err, c_n)
    evidence = {
        "baseline": {
            "errors": b_err,
            "requests": b_n,
            "ratio": b_ratio,
            "kinds": dict(base.errors.most_common(5)),
        },
        "candidate": {
            "errors": c_err,
            "requests": c_n,
            "ratio": c_ratio,
            "kinds": dict(cand.errors.most_common(5)),
        },
        "p_value": p,
    }
    shown = f"{c_err}/{c_n} ({c_ratio:.2%}) vs {b_err}/{b_n} ({b_ratio:.2%})"
    if c_ratio - b_ratio > t.errors and p < 1 - t.confidence:
        top = cand.errors.most_common(1)
        summary = f"more errors: {shown}" + (f"; most often: {top[0][0]}" if top else "")
        return Verdict("errors", "fail", summary, 1 - p, evidence)
    return Verdict("errors", "pass", f"errors alike: {shown}", p if c_err > b_err else 1.0, evidence)


def _peak(build: BuildSeries, start: float, end: float) -> float | None:
    values = [v for ts, v in build.points(RSS) if start <= ts <= end]
    return max(values) if values else None


def judge_peak(m: Measurement, t: Thresholds) -> Verdict:
    base, cand = (_peak(b, m.start, m.end) for b in m.builds)
    if base is None or cand is None:
        return Verdict("peak-memory", "unknown", "no RSS samples")

    def worse(b: float, c: float) -> bool:
        return c >= b * (1 + t.peak) and c - b >= t.peak_bytes

    per_round = []
    for start, end, _ in m.rounds:
        b, c = _peak(m.builds[0], start, end), _peak(m.builds[1], start, end)
        if b is not None and c is not None:
            per_round.append({"baseline": b, "candidate": c, "worse": worse(b, c)})
    share = (
        sum(r["worse"] for r in per_round) / len(per_round)
        if per_round
        else (1.0 if worse(base, cand) else 0.0)
    )
    evidence = {"baseline_bytes": base, "candidate_bytes": cand, "rounds": per_round}
    shown = (
        f"{format_bytes(cand)} vs {format_bytes(base)} ({cand / base - 1:+.1%})"
        if base
        else format_bytes(cand)
    )
    if worse(base, cand):
        return Verdict("peak-memory", "fail", f"higher peak memory: {shown}", share, evidence)
    within = f"+{t.peak:.0%} and {format_bytes(t.peak_bytes)}"
    return Verdict("peak-memory", "pass", f"peak memory within {within}: {shown}", 1 - share, evidence)


def judge_all(m: Measurement, t: Thresholds, resamples: int = 1000, seed: int = 1) -> list[Verdict]:
    leak = judge_leak(m, t)
    return [
        leak,
        judge_fragmentation(m, t, leak),
        judge_slower(m, t, resamples, seed),
        judge_cpu(m, t, resamples, seed),
        judge_errors(m, t),
        judge_peak(m, t),
    ]


def latency_summary(record: Record) -> dict[str, float | int]:
    values = sorted(v for v, ok in zip(record.latency, record.ok, strict=True) if ok)
    return {
        "requests": record.count,
        "errors": record.failures,
        "p50": quantile(values, 0.5),
        "p90": quantile(values, 0.9),
        "p99": quantile(values, 0.99),
    }
