"""An instance's suspects from the store, ranked: each histogram kind through `suspects.rank` with its
share of the growth, then the Python part (`pysuspects.python_order`: holders, sites first), which is
built on `suspects` and so is joined here, above both.
"""

from __future__ import annotations

from agent.core.histograms import Snapshot
from agent.detect.explain.pysuspects import python_order
from agent.detect.explain.suspects import (
    SUSPECT_KINDS,
    Suspect,
    current_lifetime,
    histogram_growth,
    native_order,
    process_growth,
    rank,
    with_shares,
)
from agent.detect.explain.sustained import MIN_POINTS
from agent.state.histograms import HistogramStore
from agent.state.store import Store


def suspects_for(
    store: Store,
    instance: str,
    since: float,
    now: float,
    *,
    kinds: tuple[str, ...] = SUSPECT_KINDS,
    limit: int = 10,
    min_points: int = MIN_POINTS,
    native: bool = False,
) -> list[Suspect]:
    """The top `limit` suspects of `instance` from the snapshots in [since, now], across kinds,
    ranked by sustained byte growth weighted by confidence; with `native` (the growth is outside the
    Java heap), JVM classes whose counts follow the RSS floor first."""
    histos = HistogramStore(store)
    found: list[Suspect] = []
    for kind in kinds:
        snapshots = histos.history(instance, kind, since, now)
        if not snapshots:
            continue
        by_source: dict[str, list[Snapshot]] = {}
        for snapshot in snapshots:
            by_source.setdefault(snapshot.source, []).append(snapshot)
        for source, series in by_source.items():
            floor = None
            if native and source == "jvm":
                floor = store.series(
                    instance, "rss_bytes", since, now, agg="min", max_points=500, now=now
                ).points
            ranked = rank(series, min_points, native=floor or None)
            if ranked:
                first = current_lifetime(series)[0].ts  # the growth of the same span, in the same process
                reference = process_growth(store, instance, kind, max(since, first), now)
                found.extend(with_shares(ranked, reference, histogram_growth(series)))
    if native:
        found.sort(key=native_order)
    else:
        found.sort(key=lambda s: (-s.bytes_per_second * s.confidence, s.name))
        found = python_order(found, histos, instance, since, now)
    return found[:limit]
