"""Histogram snapshots (JVM classes, Python types and containers, allocation sites, NMT categories) as records,
and their compaction to the rows worth keeping.

A probe returns its snapshots in `ProbeResult.snapshots`; the collector stores them
(`agent.state.histograms`). A compacted snapshot keeps the union of its top N rows by bytes and by
count (a leaking class of small objects ranks high by count long before it does by bytes) plus exact
totals, so a diff can tell a trimmed side from a row that is really absent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TOP = 200
# source -> what its rows name
KINDS = {
    "jvm": "class",
    "python": "type",
    "jemalloc": "site",
    "gperftools": "site",
    "tracemalloc": "site",  # Python allocation sites (file:line) from the hook's tracemalloc session
    "containers": "container",  # Python containers named by where they live (`cache_service.cache`)
    "nmt": "nmt",
    "jfr": "retainer",  # what holds a JVM's leaked objects: JFR old-object samples and their GC roots
}


@dataclass(frozen=True, slots=True)
class HistogramRow:
    name: str
    count: float
    bytes: float
    detail: str | None = None  # a class's module, a site's call stack


@dataclass(slots=True)
class Snapshot:
    """One histogram of one process at one time; `rows` may be only the top of it (see `rows_total`)."""

    instance: str
    source: str  # jvm | python | containers | jemalloc | gperftools | tracemalloc | nmt
    ts: float
    rows: list[HistogramRow]
    total_count: float
    total_bytes: float
    pid: int | None = None
    start_time: float | None = None
    rows_total: int = 0  # distinct names before trimming
    meta: dict[str, Any] = field(default_factory=dict)
    id: int | None = None

    @property
    def kind(self) -> str:
        return KINDS.get(self.source, "class")

    @property
    def trimmed(self) -> bool:
        return self.rows_total > len(self.rows)

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "instance": self.instance,
            "source": self.source,
            "kind": self.kind,
            "ts": self.ts,
            "pid": self.pid,
            "start_time": self.start_time,
            "total_count": self.total_count,
            "total_bytes": self.total_bytes,
            "rows_kept": len(self.rows),
            "rows_total": self.rows_total,
            "meta": self.meta,
        }

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        rows = sorted(self.rows, key=lambda r: (-r.bytes, -r.count, r.name))[:top]
        return {
            **self.info(),
            "rows": [{"name": r.name, "count": r.count, "bytes": r.bytes, "detail": r.detail} for r in rows],
        }


def compact(snapshot: Snapshot, top: int = DEFAULT_TOP) -> Snapshot:
    """The snapshot with only its top `top` rows by bytes and by count (totals stay exact)."""
    rows = snapshot.rows
    total = max(snapshot.rows_total, len(rows))
    if len(rows) > top:
        by_bytes = sorted(rows, key=lambda r: (-r.bytes, r.name))[:top]
        by_count = sorted(rows, key=lambda r: (-r.count, r.name))[:top]
        kept = {r.name: r for r in (*by_bytes, *by_count)}
        rows = sorted(kept.values(), key=lambda r: (-r.bytes, -r.count, r.name))
    return Snapshot(
        snapshot.instance,
        snapshot.source,
        snapshot.ts,
        list(rows),
        snapshot.total_count,
        snapshot.total_bytes,
        snapshot.pid,
        snapshot.start_time,
        total,
        dict(snapshot.meta),
        snapshot.id,
    )


def rows_from(items: Iterable[tuple[str, float, float]]) -> list[HistogramRow]:
    """Rows from `(name, count, bytes)` triples, merging repeated names."""
    merged: dict[str, list[float]] = {}
    for name, count, size in items:
        row = merged.setdefault(name, [0.0, 0.0])
        row[0] += count
        row[1] += size
    return [HistogramRow(name, c, b) for name, (c, b) in merged.items()]
