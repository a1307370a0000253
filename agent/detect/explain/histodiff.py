"""What changed between two histogram snapshots of one instance, row by row (`medic histo --diff`,
`/histograms/diff`, `/heap/diff`, `medic heap --file NEW --base-file OLD`).

A row absent from a trimmed side is marked `approximate`: its value there is at most that side's
cutoff, not zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.core.histograms import Snapshot


@dataclass(frozen=True, slots=True)
class RowDelta:
    name: str
    count_before: float
    count_after: float
    bytes_before: float
    bytes_after: float
    detail: str | None = None
    approximate: bool = False  # absent from a trimmed side: that side's value is at most its cutoff

    @property
    def delta_count(self) -> float:
        return self.count_after - self.count_before

    @property
    def delta_bytes(self) -> float:
        return self.bytes_after - self.bytes_before

    def to_dict(self, seconds: float) -> dict[str, Any]:
        return {
            "name": self.name,
            "count_before": self.count_before,
            "count_after": self.count_after,
            "delta_count": self.delta_count,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "delta_bytes": self.delta_bytes,
            "bytes_per_second": self.delta_bytes / seconds if seconds > 0 else None,
            "detail": self.detail,
            "approximate": self.approximate,
        }


@dataclass(slots=True)
class HistogramDiff:
    before: Snapshot
    after: Snapshot
    rows: list[RowDelta]  # largest growth in bytes first

    @property
    def seconds(self) -> float:
        return self.after.ts - self.before.ts

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        return {
            "before": self.before.info(),
            "after": self.after.info(),
            "seconds": self.seconds,
            "same_process": same_process(self.before, self.after),
            "delta_count": self.after.total_count - self.before.total_count,
            "delta_bytes": self.after.total_bytes - self.before.total_bytes,
            "rows": [r.to_dict(self.seconds) for r in self.rows[:top]],
        }


def same_process(a: Snapshot, b: Snapshot) -> bool:
    """Whether both snapshots come from one process (unknown pids: assume so)."""
    if a.pid is None or b.pid is None:
        return True
    return a.pid == b.pid and abs((a.start_time or 0) - (b.start_time or 0)) < 1.0


def diff(before: Snapshot, after: Snapshot) -> HistogramDiff:
    """Row-by-row change from `before` to `after`, sorted by growth in bytes, then in count."""
    old = {r.name: r for r in before.rows}
    new = {r.name: r for r in after.rows}
    rows = []
    for name in old.keys() | new.keys():
        a, b = old.get(name), new.get(name)
        rows.append(
            RowDelta(
                name,
                a.count if a else 0.0,
                b.count if b else 0.0,
                a.bytes if a else 0.0,
                b.bytes if b else 0.0,
                b.detail if b else a.detail if a else None,
                (a is None and before.trimmed) or (b is None and after.trimmed),
            )
        )
    rows.sort(key=lambda r: (-r.delta_bytes, -r.delta_count, r.name))
    return HistogramDiff(before, after, rows)
