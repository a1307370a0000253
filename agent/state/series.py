"""One stored series read back: from raw samples or from the 1-minute rollups, in buckets.

`Store.series` chooses the source (raw samples inside the raw retention for buckets under a
minute, rollups for the rest, so a 30-day view never scans 30 days of raw samples); this module
reads it through the reader connection it is given and says which source answered.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Literal

# the rollups' bucket: samples are merged into one row per series and minute
ROLLUP_SECONDS = 60

Aggregate = Literal["mean", "min", "max"]


@dataclass(frozen=True, slots=True)
class SeriesResult:
    """Points `(ts, value)` of one series, the bucket width used and where they came from."""

    instance: str
    metric: str
    step: float
    source: Literal["raw", "rollup"]
    points: list[tuple[float, float]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "metric": self.metric,
            "step": self.step,
            "source": self.source,
            "points": [[ts, value] for ts, value in self.points],
        }


def read_series(
    db: sqlite3.Connection,
    instance: str,
    metric: str,
    since: float,
    until: float,
    step: float,
    agg: Aggregate,
    use_raw: bool,
) -> SeriesResult:
    """The points of one series in [since, until], a point per `step` (each raw sample when 0)."""
    row = db.execute("SELECT id FROM series WHERE instance=? AND metric=?", (instance, metric)).fetchone()
    if row is None:
        return SeriesResult(instance, metric, step, "raw" if use_raw else "rollup", [])
    sid = row[0]
    if use_raw:
        if step <= 0:
            cur = db.execute(
                "SELECT ts, value FROM samples WHERE series_id=? AND ts BETWEEN ? AND ? ORDER BY ts",
                (sid, since, until),
            )
        else:
            fn = {"mean": "avg(value)", "min": "min(value)", "max": "max(value)"}[agg]
            cur = db.execute(
                f"""SELECT min(ts), {fn} FROM samples WHERE series_id=? AND ts BETWEEN ? AND ?
                    GROUP BY CAST((ts - ?) / ? AS INTEGER) ORDER BY 1""",
                (sid, since, until, since, step),
            )
        return SeriesResult(instance, metric, step, "raw", [(ts, v) for ts, v in cur])
    step = max(step, float(ROLLUP_SECONDS))
    fn = {"mean": "sum(sum) / sum(count)", "min": "min(min)", "max": "max(max)"}[agg]
    cur = db.execute(
        f"""SELECT min(ts), {fn} FROM rollups WHERE series_id=? AND ts BETWEEN ? AND ?
            GROUP BY CAST((ts - ?) / ? AS INTEGER) ORDER BY 1""",
        (sid, since - ROLLUP_SECONDS, until, since, step),
    )
    return SeriesResult(instance, metric, step, "rollup", [(float(ts), v) for ts, v in cur])
