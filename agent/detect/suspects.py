"""Suspects: the classes, types and allocation sites whose growth explains a process's growth.

Each name's bytes and count across the snapshots of the current process lifetime are judged with the
leak detector's robust trend test (`agent.detect.trend`: level shifts removed, Theil-Sen slope,
Mann-Kendall confidence corrected for autocorrelation). A suspect grows in bytes **and** in count,
confidently, well clear of its scatter, with a floor that rises block after block, and without
levelling off (see `Growth.sustained`). Garbage counted by `GC.class_histogram -all` lands anywhere
in its range at each snapshot: a few snapshots of it can fool a trend test, rarely all four checks.

Platform classes and builtins that grow in step with an application class (its `byte[]`, its map
nodes) are folded into it, so that the class on-call must look for is named first.

The share of growth explained is the suspect's slope over the process's growth in the same span:
the first steadily growing series of the kind's reference list (JVM classes: heap after GC, then
RSS; Python types and native sites: allocator live bytes, then RSS), else the growth of the
histogram's total, else of the suspects together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from agent.core.histograms import Snapshot
from agent.detect.trend import mann_kendall, normal_cdf, remove_steps, theil_sen, trend
from agent.state.histograms import HistogramStore
from agent.state.store import Store

MIN_POINTS = 4  # the trend test needs at least four snapshots
MIN_CONFIDENCE = 0.95
MIN_SIGNAL = 4.0  # garbage that happens to rise over a few snapshots scatters widely around its line
MIN_ASCENT = 0.8  # ... and its floor does not rise block after block (see `ascent`)
CLEAR_SIGNAL = 20.0  # a rise this many times the scatter is judged without the autocorrelation discount
ASCENT_BLOCKS = 8
DECEL_RATIO = 0.25
STEP_FLOOR = 0.02  # as the leak detector: a level shift must exceed 2 % of the level to be removed
REFERENCES = {
    "class": ("jvm_heap_after_gc_bytes", "jvm_heap_used_bytes", "rss_bytes"),
    "type": ("allocator_allocated_bytes", "rss_bytes"),
    "site": ("allocator_allocated_bytes", "heap_profile_live_bytes", "rss_bytes"),
    "nmt": ("jvm_nmt_committed_bytes", "rss_bytes"),
}
SUSPECT_KINDS = ("class", "type", "site")
REFERENCE_CONFIDENCE = 0.9  # a reference only needs to grow, not to pass as a suspect
CARRIER_TOLERANCE = 0.15  # how close to a whole multiple of an owner's object rate a carrier's must be


@dataclass(frozen=True, slots=True)
class Suspect:
    name: str
    kind: str  # class | type | site | nmt
    source: str  # jvm | python | jemalloc | gperftools | nmt
    bytes_per_second: float
    count_per_second: float
    confidence: float  # the lower of the bytes and count trend confidences
    share: float | None  # of the process growth explained, 0..1 (None: the process does not grow)
    share_of: str | None  # the series that growth was measured on
    bytes: float  # at the last snapshot
    count: float
    points: int
    span_seconds: float
    detail: str | None = None
    carried: tuple[str, ...] = ()  # platform classes/builtins growing in step with it (its payload)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "source": self.source,
            "bytes_per_second": self.bytes_per_second,
            "bytes_per_hour": self.bytes_per_second * 3600,
            "count_per_second": self.count_per_second,
            "confidence": round(self.confidence, 6),
            "share": None if self.share is None else round(self.share, 4),
            "share_of": self.share_of,
            "bytes": self.bytes,
            "count": self.count,
            "points": self.points,
            "span_seconds": self.span_seconds,
            "detail": self.detail,
            "carried": list(self.carried),
        }


@dataclass(frozen=True, slots=True)
class Growth:
    slope: float
    confidence: float
    decel: float
    signal: float = 0.0  # rise over the window divided by the scatter around the fitted line
    ascent: float = 0.0  # share of rising steps between the minima of (up to 8) consecutive blocks

    @property
    def sustained(self) -> bool:
        """Confident, clear of the scatter, rising from block to block, and not levelling off."""
        return (
            self.slope > 0
            and self.confidence >= MIN_CONFIDENCE
            and self.signal >= MIN_SIGNAL
            and self.ascent >= MIN_ASCENT
            and self.decel >= DECEL_RATIO
        )


def ascent(ys: list[float], blocks: int = ASCENT_BLOCKS) -> float:
    """Share of steps up between the lower envelopes of consecutive blocks of `ys`.

    Garbage counted by `-all` histograms lands anywhere in its range at each snapshot, and a few random
    snapshots can line up well enough for a trend test; a leak keeps its floor rising block after block.
    Taking block minima keeps this true for a slow leak under noise over a long window.
    """
    n = len(ys)
    k = min(n, blocks)
    if k < 2:
        return 0.0
    bounds = [round(i * n / k) for i in range(k + 1)]
    floors = [min(ys[bounds[i] : bounds[i + 1]]) for i in range(k)]
    return sum(b > a for a, b in pairwise(floors)) / (k - 1)


def growth(xs: list[float], ys: list[float]) -> Growth:
    """Robust slope and one-sided confidence that `ys` grows (0 unless it visibly rose)."""
    if len(xs) < MIN_POINTS or max(ys) == min(ys):
        return Growth(0.0, 0.0, 0.0)
    steps = remove_steps(ys, STEP_FLOOR * abs(ys[-1]))
    if not steps.risen:
        return Growth(theil_sen(xs, steps.clean), 0.0, 0.0)
    z = mann_kendall(steps.clean)[1]
    fitted = trend(xs, ys, steps, z)
    rise = fitted.slope * (xs[-1] - xs[0])
    signal = rise / fitted.noise if fitted.noise > 0 else math.inf
    # the trend test discounts z for autocorrelated residuals (a drift wandering up for hours); on a
    # few snapshots of a near-perfect line the residuals are specks whose pattern says nothing
    confidence = normal_cdf(z) if signal >= CLEAR_SIGNAL else fitted.confidence
    return Growth(fitted.slope, confidence, fitted.decel, signal, ascent(steps.clean))


def current_lifetime(snapshots: list[Snapshot]) -> list[Snapshot]:
    """The snapshots of the process that took the last one (a restart resets every series)."""
    if not snapshots:
        return []
    last = snapshots[-1]
    same = [
        s
        for s in snapshots
        if s.source == last.source
        and (
            last.pid is None or (s.pid == last.pid and abs((s.start_time or 0) - (last.start_time or 0)) < 1)
        )
    ]
    return same


def rank(
    snapshots: list[Snapshot],
    min_points: int = MIN_POINTS,
    min_confidence: float = MIN_CONFIDENCE,
) -> list[Suspect]:
    """Suspects of one histogram series (one kind, one process), largest sustained byte growth first."""
    snapshots = current_lifetime(snapshots)
    if len(snapshots) < min_points:
        return []
    last = snapshots[-1]
    series: dict[str, list[tuple[float, float, float]]] = {}
    for snapshot in snapshots:
        for row in snapshot.rows:
            series.setdefault(row.name, []).append((snapshot.ts, row.count, row.bytes))
    details = {row.name: row.detail for row in last.rows}
    found = []
    for name, points in series.items():
        if len(points) < min_points or name not in details:
            continue
        xs = [p[0] for p in points]
        by_bytes = growth(xs, [p[2] for p in points])
        counts = [p[1] for p in points]
        by_count = growth(xs, counts) if any(counts) else by_bytes  # NMT categories have no counts
        confidence = min(by_bytes.confidence, by_count.confidence)
        if confidence < min_confidence or not (by_bytes.sustained and by_count.sustained):
            continue
        found.append(
            Suspect(
                name,
                last.kind,
                last.source,
                by_bytes.slope,
                by_count.slope if any(counts) else 0.0,
                confidence,
                None,
                None,
                points[-1][2],
                points[-1][1],
                len(points),
                xs[-1] - xs[0],
                details[name],
            )
        )
    if last.kind in ("class", "type"):
        found = absorb_carriers(found)
    found.sort(key=lambda s: (-s.bytes_per_second * s.confidence, s.name))
    return found


def is_platform(suspect: Suspect) -> bool:
    """JDK classes and arrays (`[B`, `java.util.HashMap$Node`), Python builtins (`dict`): the containers and
    payloads that application objects hold, rarely the culprit themselves."""
    if suspect.kind == "type":
        return "." not in suspect.name
    module = suspect.detail or ""
    return suspect.name.startswith(("[", "java.", "jdk.", "sun.", "com.sun.")) or module.startswith(
        ("java.", "jdk.")
    )


def absorb_carriers(found: list[Suspect]) -> list[Suspect]:
    """Fold each platform suspect whose object count grows at a small whole multiple (1–8×) of an
    application suspect's into that suspect: a leaked `Record` drags its `byte[]` payload and its
    `HashMap$Node` along, and the record is what on-call must look for."""
    owners = [s for s in found if not is_platform(s) and s.count_per_second > 0]
    if not owners:
        return found
    absorbed: dict[str, list[Suspect]] = {s.name: [] for s in owners}
    kept = []
    for suspect in found:
        owner = _owner(suspect, owners) if is_platform(suspect) else None
        if owner is None:
            kept.append(suspect)
        else:
            absorbed[owner.name].append(suspect)
    out = []
    for suspect in kept:
        carried = absorbed.get(suspect.name) or []
        if carried:
            suspect = replace(
                suspect,
                bytes_per_second=suspect.bytes_per_second + sum(c.bytes_per_second for c in carried),
                bytes=suspect.bytes + sum(c.bytes for c in carried),
                carried=tuple(c.name for c in carried),
            )
        out.append(suspect)
    return out


def _owner(suspect: Suspect, owners: list[Suspect]) -> Suspect | None:
    best, best_error = None, CARRIER_TOLERANCE
    for owner in owners:
        ratio = suspect.count_per_second / owner.count_per_second
        multiple = round(ratio)
        if 1 <= multiple <= 8:
            error = abs(ratio - multiple) / multiple
            if error <= best_error:
                best, best_error = owner, error
    return best


def histogram_growth(snapshots: list[Snapshot]) -> float:
    """Slope of a series' total bytes (the fallback denominator of shares)."""
    snapshots = current_lifetime(snapshots)
    if len(snapshots) < 2:
        return 0.0
    return theil_sen([s.ts for s in snapshots], [s.total_bytes for s in snapshots])


def process_growth(
    store: Store, instance: str, kind: str, since: float, now: float
) -> tuple[float, str] | None:
    """Slope (bytes/s) of the first growing reference series of `kind`, on its lower envelope."""
    for metric in REFERENCES.get(kind, ("rss_bytes",)):
        points = store.series(instance, metric, since, now, agg="min", max_points=60, now=now).points
        if len(points) < MIN_POINTS:
            continue
        fitted = growth([p[0] for p in points], [p[1] for p in points])
        if fitted.slope > 0 and fitted.confidence >= REFERENCE_CONFIDENCE:
            return fitted.slope, metric
    return None


def with_shares(suspects: list[Suspect], reference: tuple[float, str] | None, total: float) -> list[Suspect]:
    """Each suspect's share of the reference growth; without a growing reference, of the histogram's
    total growth, or (when garbage hides that) of the suspects' growth together."""
    if reference is not None:
        slope, name = reference
    elif total > 0:
        slope, name = total, "histogram_total"
    else:
        slope, name = sum(s.bytes_per_second for s in suspects), "suspects_total"
    if slope <= 0:
        return suspects
    return [replace(s, share=min(1.0, s.bytes_per_second / slope), share_of=name) for s in suspects]


def suspects_for(
    store: Store,
    instance: str,
    since: float,
    now: float,
    *,
    kinds: tuple[str, ...] = SUSPECT_KINDS,
    limit: int = 10,
    min_points: int = MIN_POINTS,
) -> list[Suspect]:
    """The top `limit` suspects of `instance` from the snapshots in [since, now], across kinds,
    ranked by sustained byte growth weighted by confidence."""
    histos = HistogramStore(store)
    found: list[Suspect] = []
    for kind in kinds:
        snapshots = histos.history(instance, kind, since, now)
        if not snapshots:
            continue
        by_source: dict[str, list[Snapshot]] = {}
        for snapshot in snapshots:
            by_source.setdefault(snapshot.source, []).append(snapshot)
        for series in by_source.values():
            ranked = rank(series, min_points)
            if ranked:
                first = current_lifetime(series)[0].ts  # the growth of the same span, in the same process
                reference = process_growth(store, instance, kind, max(since, first), now)
                found.extend(with_shares(ranked, reference, histogram_growth(series)))
    found.sort(key=lambda s: (-s.bytes_per_second * s.confidence, s.name))
    return found[:limit]


def describe(suspect: Suspect) -> str:
    """One line for people: `Leak$Record (class) +12.0 MiB/h, 95 % of the growth`."""
    from agent.core.units import format_bytes

    share = "" if suspect.share is None else f", {100 * suspect.share:.0f} % of the growth"
    rate = format_bytes(suspect.bytes_per_second * 3600)
    return f"{suspect.name} ({suspect.kind}) +{rate}/h{share}"
