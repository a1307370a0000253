"""What the offline readers produce: series per instance, and the problems met on the way."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from operator import itemgetter, le
from typing import Any

from agent.core.errors import SeriesFormatError
from agent.core.figures import EARLIEST_TIME, LATEST_TIME
from agent.detect.model import InstanceSeries, Points

MAX_KEPT_PROBLEMS = 1000
MAX_LABELS = 64


@dataclass(frozen=True, slots=True)
class Problem:
    source: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        return f"{where}: {self.message}"


@dataclass(slots=True)
class ImportResult:
    """Series per instance, plus the problems met (the first `MAX_KEPT_PROBLEMS` of `problem_count`).

    Each series is kept as two arrays of doubles (times, values) while reading: compact, and
    turned into points one series at a time, so a series' numbers sit side by side in memory
    (the detectors read them many times over, and run a quarter faster than on numbers
    scattered among the decoded records)."""

    columns: dict[str, dict[str, tuple[array[float], array[float]]]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    points: int = 0
    labels: dict[str, dict[str, str]] = field(default_factory=dict)  # per instance: the first labels seen

    def remember_labels(self, instance: str, labels: Any) -> None:
        """Keep an instance's string labels (the first seen, at most `MAX_LABELS` of them, each
        value at most 256 characters): what `--fleet-label` groups instances by."""
        if instance in self.labels or not isinstance(labels, dict):
            return
        kept = {
            k: v for k, v in list(labels.items())[:MAX_LABELS]
            if isinstance(k, str) and isinstance(v, str) and len(k) <= 256 and len(v) <= 256
        }  # fmt: skip
        self.labels[instance] = kept

    def add_problem(self, problem: Problem, strict: bool) -> None:
        if strict:
            raise SeriesFormatError(f"{problem} (run without --strict to skip bad lines)")
        self.problem_count += 1
        if len(self.problems) < MAX_KEPT_PROBLEMS:
            self.problems.append(problem)

    def column(self, instance: str, metric: str) -> tuple[array[float], array[float]]:
        """The (times, values) arrays of one series, created empty on first use."""
        metrics = self.columns.setdefault(instance, {})
        found = metrics.get(metric)
        if found is None:
            found = metrics[metric] = (array("d"), array("d"))
        return found

    def merge(self, other: ImportResult) -> None:
        """Add what another result read after what this one holds (its arrays are taken, not copied)."""
        for instance, metrics in other.columns.items():
            mine = self.columns.setdefault(instance, {})
            for metric, (times, values) in metrics.items():
                if metric in mine:
                    mine[metric][0].extend(times)
                    mine[metric][1].extend(values)
                else:
                    mine[metric] = (times, values)
        for instance, labels in other.labels.items():
            self.remember_labels(instance, labels)
        for problem in other.problems:
            self.add_problem(problem, strict=False)
        self.problem_count += other.problem_count - len(other.problems)
        self.points += other.points

    def drop_times_out_of_range(self) -> None:
        """Drop samples stamped before 1970 or after 2100, one problem per series: a stray time
        decades away would stretch the replay over decades of empty buckets (minutes become hours)."""
        for instance, metrics in self.columns.items():
            for metric, (times, values) in metrics.items():
                if not times or (min(times) >= EARLIEST_TIME and max(times) <= LATEST_TIME):
                    continue
                keep = [i for i, t in enumerate(times) if EARLIEST_TIME <= t <= LATEST_TIME]
                dropped = len(times) - len(keep)
                metrics[metric] = (
                    array("d", (times[i] for i in keep)),
                    array("d", (values[i] for i in keep)),
                )
                self.points -= dropped
                message = f"{metric}: {dropped} samples stamped before 1970 or after 2100 dropped"
                self.add_problem(Problem(instance, None, message), strict=False)

    @property
    def series(self) -> dict[str, dict[str, Points]]:
        """Points per metric per instance, in the order read."""
        return {
            name: {metric: list(zip(times, values)) for metric, (times, values) in metrics.items()}
            for name, metrics in self.columns.items()
        }

    def instances(self, memory_limit: float | None = None) -> list[InstanceSeries]:
        """One `InstanceSeries` per instance, points sorted by time."""
        out = []
        for name in sorted(self.columns):
            metrics = {
                metric: sorted_points(times, values) for metric, (times, values) in self.columns[name].items()
            }
            out.append(InstanceSeries(name, metrics, memory_limit=memory_limit))
        return out


def parse_number(raw: Any, name: str) -> tuple[float, str | None]:
    """(value, problem) for a JSON number or numeric string."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        return 0.0, f"{name} must be a number, got {type(raw).__name__}"
    try:
        value = float(raw)
    except (ValueError, OverflowError):
        return 0.0, f"{name} must be a number, got {str(raw)[:40]!r}"
    if not math.isfinite(value):
        return 0.0, f"{name} must be finite, got {str(raw)[:40]!r}"
    return value, None


def sorted_points(times: array[float], values: array[float]) -> Points:
    """The points of one series in time order (a stable sort keeps equal times as read)."""
    points = list(zip(times, values))
    plain = times.tolist()  # floats compared as a list's, not boxed twice from the array
    if all(map(le, plain[:-1], plain[1:])):
        return points
    return sorted(points, key=itemgetter(0))
