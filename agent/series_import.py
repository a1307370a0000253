"""Offline readers of recorded memory series for `medic analyze` and the benchmark.

Two formats, told apart by their first non-blank character:

- JSON Lines: one object per line, `{"ts": <unix s>, "instance": "...", "metric": "rss_bytes",
  "value": <number>}` (extra keys are ignored; numbers may be given as numeric strings).
- A Prometheus `query_range` export: `{"status": "success", "data": {"resultType": "matrix",
  "result": [{"metric": {labels}, "values": [[ts, "value"], ...]}]}}`. The instance is the
  value of a label (`instance` unless told otherwise), the metric is `__name__` mapped to medic's
  names where the meaning is the same (`process_resident_memory_bytes` → `rss_bytes`).

Files may be gzip-compressed (`.gz`). A malformed line or series is reported with its file and
line number and skipped, unless `strict`, where the first one raises `SeriesFormatError`. Nothing
but `SeriesFormatError` ever leaves this module.
"""

from __future__ import annotations

import gc
import gzip
import json
import math
import operator
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import compress
from operator import itemgetter, le
from pathlib import Path
from typing import Any

from agent.detect.model import InstanceSeries, Points
from agent.errors import SeriesFormatError

# Prometheus names whose meaning equals one of medic's (see agent.catalog)
PROMETHEUS_NAMES = {
    "process_resident_memory_bytes": "rss_bytes",
    "process_virtual_memory_bytes": "vms_bytes",
    "process_start_time_seconds": "process_start_time_seconds",
    "container_memory_rss": "rss_bytes",
    "container_memory_working_set_bytes": "cgroup_memory_working_set_bytes",
    "container_memory_usage_bytes": "cgroup_memory_usage_bytes",
    "container_spec_memory_limit_bytes": "memory_limit_bytes",
    "kube_pod_container_resource_limits_memory_bytes": "memory_limit_bytes",
    "jvm_gc_live_data_size_bytes": "jvm_heap_after_gc_bytes",
}
MEDIC_PREFIX = "medic_"  # medic's own /metrics names map back by dropping the prefix
LABEL_FALLBACKS = ("instance", "pod", "name", "job")
_call = getattr(operator, "call", lambda function, arg: function(arg))  # operator.call is 3.11+
CHUNK_CHARS = 1 << 21  # JSON Lines are parsed about this many characters at a time (one json.loads each)
MAX_KEPT_PROBLEMS = 1000
_NUMBERS = {int, float}  # JSON numbers (a bool is not one)


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

    columns: dict[str, dict[str, tuple[array, array]]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    points: int = 0

    def add_problem(self, problem: Problem, strict: bool) -> None:
        if strict:
            raise SeriesFormatError(f"{problem} (run without --strict to skip bad lines)")
        self.problem_count += 1
        if len(self.problems) < MAX_KEPT_PROBLEMS:
            self.problems.append(problem)

    def column(self, instance: str, metric: str) -> tuple[array, array]:
        """The (times, values) arrays of one series, created empty on first use."""
        metrics = self.columns.setdefault(instance, {})
        found = metrics.get(metric)
        if found is None:
            found = metrics[metric] = (array("d"), array("d"))
        return found

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
                metric: _sorted(times, values) for metric, (times, values) in self.columns[name].items()
            }
            out.append(InstanceSeries(name, metrics, memory_limit=memory_limit))
        return out


def read_files(
    paths: Iterable[str | Path],
    *,
    strict: bool = False,
    label: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ImportResult:
    """Read every file into one result; `progress(bytes_done, bytes_total)` as it goes."""
    paths = [Path(p) for p in paths]
    sizes = []
    for path in paths:
        try:
            sizes.append(path.stat().st_size)
        except OSError as exc:
            raise SeriesFormatError(
                f"{path}: cannot read it ({exc.strerror or exc}); check the path"
            ) from None
    total = sum(sizes)
    result = ImportResult()
    done = 0
    with collector_paused():
        for path, size in zip(paths, sizes, strict=True):
            text = _read_text(path)
            read_text(text, str(path), result, strict=strict, label=label)
            done += size
            if progress is not None:
                progress(done, total)
    return result


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while millions of acyclic tuples are made: it would
    scan them again and again (a third of the reading time) and find nothing to free."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_text(
    text: str,
    source: str,
    result: ImportResult | None = None,
    *,
    strict: bool = False,
    label: str | None = None,
) -> ImportResult:
    """Parse one file's text (either format) into `result` (a new one if None)."""
    result = result if result is not None else ImportResult()
    head = text.lstrip()[:1]
    if not head:
        result.add_problem(Problem(source, None, "the file is empty"), strict)
        return result
    doc = _whole_document(text) if head == "{" else None
    if isinstance(doc, dict) and "data" in doc:
        _read_prometheus_doc(doc, source, result, strict, label)
    elif doc is None and head == "{" and _looks_like_prometheus(text):
        _read_prometheus(text, source, result, strict, label)  # says where the document is broken
    else:
        _read_jsonl(text, source, result, strict)
    return result


# ---------------------------------------------------------------------------------------------
# JSON Lines


def _read_jsonl(text: str, source: str, result: ImportResult, strict: bool) -> None:
    """Parse about `CHUNK_CHARS` of whole lines at a time with one `json.loads` (the lines joined
    into one JSON array); a chunk that does not parse cleanly is read again line by line, so
    each bad line is reported with its number and the good ones are kept."""
    size = len(text)
    start, line_no = 0, 1
    while start < size:
        end = text.find("\n", start + CHUNK_CHARS)
        end = size if end < 0 else end + 1
        chunk = text[start:end]
        body = chunk.rstrip()  # the newline that ends the chunk (and the file)
        if body and not _add_chunk(body, result):
            for i, line in enumerate(body.split("\n")):
                if line and not line.isspace():
                    _add_line(line, line_no + i, source, result, strict)
        line_no += chunk.count("\n")
        start = end


def _add_chunk(body: str, result: ImportResult) -> bool:
    """Add a chunk of lines in one parse; False (nothing added) if any line is blank, malformed
    or irregular."""
    try:
        records = json.loads("[" + body.replace("\n", ",") + "]")
    except (ValueError, RecursionError):
        return False
    return len(records) == body.count("\n") + 1 and _add_fast(records, result)


def _add_fast(records: list[Any], result: ImportResult) -> bool:
    """Add a chunk of well-formed records in bulk; False (nothing added) if any is irregular."""
    try:
        if set(map(type, records)) != {dict}:
            return False
        times = list(map(itemgetter("ts"), records))
        values = list(map(itemgetter("value"), records))
        instances = list(map(itemgetter("instance"), records))
        metrics = list(map(itemgetter("metric"), records))
    except KeyError:
        return False
    if not set(map(type, times)) <= _NUMBERS or not set(map(type, values)) <= _NUMBERS:
        return False
    try:  # a huge integer does not fit the arrays of doubles the series are kept in
        if not all(map(math.isfinite, times)) or not all(map(math.isfinite, values)):
            return False
    except OverflowError:
        return False
    try:
        keys = list(zip(instances, metrics, strict=True))
        distinct = list(set(keys))
    except TypeError:  # an unhashable instance or metric (a list, an object)
        return False
    # names are checked once per distinct series, not once per record
    if not all(type(i) is str and type(m) is str and i and m for i, m in distinct):
        return False
    series_of = list(map({key: i for i, key in enumerate(distinct)}.__getitem__, keys))
    columns = [result.column(*key) for key in distinct]
    # append each number to its series without a Python-level loop (a third of the reading time)
    append_time = [times_values[0].append for times_values in columns]
    append_value = [times_values[1].append for times_values in columns]
    deque(map(_call, map(append_time.__getitem__, series_of), times), maxlen=0)
    deque(map(_call, map(append_value.__getitem__, series_of), values), maxlen=0)
    result.points += len(records)
    return True


def _add_line(line: str, lineno: int, source: str, result: ImportResult, strict: bool) -> None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:
        msg = getattr(exc, "msg", None) or "not valid JSON"
        result.add_problem(
            Problem(source, lineno, f"not a JSON object ({msg}); expected {_JSONL_SHAPE}"), strict
        )
        return
    if not isinstance(record, dict):
        result.add_problem(Problem(source, lineno, f"not a JSON object; expected {_JSONL_SHAPE}"), strict)
        return
    missing = [key for key in ("ts", "instance", "metric", "value") if key not in record]
    if missing:
        result.add_problem(
            Problem(source, lineno, f"missing {', '.join(missing)}; expected {_JSONL_SHAPE}"), strict
        )
        return
    instance, metric = record["instance"], record["metric"]
    if not isinstance(instance, str) or not instance or not isinstance(metric, str) or not metric:
        result.add_problem(Problem(source, lineno, "instance and metric must be non-empty strings"), strict)
        return
    ts, ts_problem = _number(record["ts"], "ts")
    value, value_problem = _number(record["value"], "value")
    if ts_problem or value_problem:
        result.add_problem(Problem(source, lineno, ts_problem or value_problem), strict)
        return
    times, values = result.column(instance, metric)
    times.append(ts)
    values.append(value)
    result.points += 1


_JSONL_SHAPE = '{"ts": <unix seconds>, "instance": "...", "metric": "rss_bytes", "value": <number>}'


def _number(raw: Any, name: str) -> tuple[float, str | None]:
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


# ---------------------------------------------------------------------------------------------
# Prometheus query_range export


def _looks_like_prometheus(text: str) -> bool:
    """A single JSON document with `data` and `resultType`, rather than one object per line."""
    first_line = text.lstrip().split("\n", 1)[0]
    try:
        first = json.loads(first_line)
    except (ValueError, RecursionError):
        head = text[:65536]
        return '"resultType"' in head and '"data"' in head  # a pretty-printed document
    return isinstance(first, dict) and "data" in first


def _whole_document(text: str) -> Any:
    """The text as one JSON document, or None when it is not one. JSON Lines fail fast: the
    decoder stops at the end of the first line ("Extra data")."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _read_prometheus(text: str, source: str, result: ImportResult, strict: bool, label: str | None) -> None:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        line = getattr(exc, "lineno", None)
        msg = getattr(exc, "msg", None) or "not valid JSON"
        raise SeriesFormatError(
            f"{source}:{line or 1}: not valid JSON ({msg}); expected a Prometheus query_range export "
            "or JSON Lines"
        ) from None
    _read_prometheus_doc(doc, source, result, strict, label)


def _read_prometheus_doc(
    doc: Any, source: str, result: ImportResult, strict: bool, label: str | None
) -> None:
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict):
        raise SeriesFormatError(f"{source}: no 'data' object; expected a Prometheus query_range export")
    if isinstance(doc, dict) and doc.get("status", "success") != "success":
        raise SeriesFormatError(
            f"{source}: the export has status {doc.get('status')!r}: {doc.get('error', '')}"
        )
    if data.get("resultType") != "matrix":
        raise SeriesFormatError(
            f"{source}: resultType is {data.get('resultType')!r}; export a range query (resultType matrix), "
            "e.g. /api/v1/query_range"
        )
    entries = data.get("result")
    if not isinstance(entries, list):
        raise SeriesFormatError(f"{source}: 'data.result' must be a list of series")
    for number, entry in enumerate(entries, 1):
        where = f"series #{number}"
        if not isinstance(entry, dict) or not isinstance(entry.get("metric"), dict):
            result.add_problem(
                Problem(source, None, f"{where}: expected {{'metric': {{labels}}, 'values': [...]}}"), strict
            )
            continue
        labels = entry["metric"]
        instance = _instance_of(labels, label)
        metric = _metric_of(labels)
        if instance is None or metric is None:
            what = (
                f"the label {label!r}"
                if label
                else "an instance label (instance, pod, name, job) or __name__"
            )
            result.add_problem(
                Problem(
                    source,
                    None,
                    f"{where} ({_short(labels)}) lacks {what}; use --label NAME to pick the label that names the instance",
                ),
                strict,
            )
            continue
        _add_values(
            entry.get("values"), instance, metric, f"{where} ({instance}, {metric})", source, result, strict
        )


def _add_values(
    values: Any, instance: str, metric: str, where: str, source: str, result: ImportResult, strict: bool
) -> None:
    if not isinstance(values, list):
        result.add_problem(
            Problem(source, None, f"{where}: 'values' must be a list of [ts, \"value\"]"), strict
        )
        return
    fast = _values_fast(values)
    if fast is not None:
        times, numbers = fast
        if times:
            column = result.column(instance, metric)
            column[0].extend(times)
            column[1].extend(numbers)
            result.points += len(times)
        return
    points: list[tuple[float, float]] = []
    bad = 0
    for pair in values:
        if not isinstance(pair, list) or len(pair) != 2:
            bad += 1
            continue
        ts, ts_problem = _number(pair[0], "ts")
        value, value_problem = _number(pair[1], "value")
        if ts_problem or (value_problem and not _is_nan_or_inf(pair[1])):
            bad += 1
        elif not value_problem:
            points.append((ts, value))
    if bad:
        result.add_problem(
            Problem(source, None, f"{where}: skipped {bad} malformed [ts, value] pairs"), strict
        )
    _extend(result, instance, metric, points)


def _extend(result: ImportResult, instance: str, metric: str, points: list[tuple[float, float]]) -> None:
    if points:
        times, values = result.column(instance, metric)
        times.extend(map(itemgetter(0), points))
        values.extend(map(itemgetter(1), points))
        result.points += len(points)


def _values_fast(values: list) -> tuple[list[float], list[float]] | None:
    """(times, values) of the finite points of a well-formed `values` list, in bulk (NaN and
    ±Inf are gaps), or None when any pair is irregular (then each pair is checked and reported
    on its own)."""
    if not values:
        return [], []
    if set(map(type, values)) != {list} or set(map(len, values)) != {2}:
        return None
    raw_times = list(map(itemgetter(0), values))
    raw_values = list(map(itemgetter(1), values))
    if not set(map(type, raw_times)) <= {int, float} or not set(map(type, raw_values)) <= {str, int, float}:
        return None
    try:
        numbers = list(map(float, raw_values))
    except (ValueError, OverflowError):
        return None
    if not all(map(math.isfinite, raw_times)):
        return None
    if all(map(math.isfinite, numbers)):
        return raw_times, numbers
    kept = list(compress(range(len(numbers)), map(math.isfinite, numbers)))
    return list(map(raw_times.__getitem__, kept)), list(map(numbers.__getitem__, kept))


def _is_nan_or_inf(raw: Any) -> bool:
    """Prometheus writes NaN and ±Inf as strings; they are gaps, not errors."""
    return isinstance(raw, str) and raw.strip().lower().lstrip("+-") in ("nan", "inf")


def _instance_of(labels: dict, label: str | None) -> str | None:
    names = (label,) if label else LABEL_FALLBACKS
    for name in names:
        value = labels.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _metric_of(labels: dict) -> str | None:
    name = labels.get("__name__")
    if not isinstance(name, str) or not name:
        return None
    if name in PROMETHEUS_NAMES:
        return PROMETHEUS_NAMES[name]
    if name.startswith(MEDIC_PREFIX):
        return name[len(MEDIC_PREFIX) :]
    return name


def _short(labels: dict) -> str:
    text = ",".join(f"{k}={v}" for k, v in list(labels.items())[:4])
    return text[:80]


# ---------------------------------------------------------------------------------------------
# files


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return raw.decode("utf-8")
    except OSError as exc:
        raise SeriesFormatError(f"{path}: cannot read it ({exc.strerror or exc}); check the path") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise SeriesFormatError(
            f"{path}: a damaged gzip file ({exc}); decompress it or record it again"
        ) from None
    except UnicodeDecodeError as exc:
        raise SeriesFormatError(
            f"{path}: not UTF-8 text (byte {exc.start}); expected JSON Lines or a Prometheus JSON export"
        ) from None


def _sorted(times: array, values: array) -> Points:
    """The points of one series in time order (a stable sort keeps equal times as read)."""
    points = list(zip(times, values))
    if all(map(le, times[:-1], times[1:])):
        return points
    return sorted(points, key=itemgetter(0))


__all__ = ["ImportResult", "Problem", "read_files", "read_text"]
