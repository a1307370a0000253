"""The Prometheus `query_range` export reader: `{"status": "success", "data": {"resultType":
"matrix", "result": [{"metric": {labels}, "values": [[ts, "value"], ...]}]}}`. The instance is the
value of a label (`instance` unless told otherwise), the metric is `__name__` mapped to medic's
names where the meaning is the same (`process_resident_memory_bytes` → `rss_bytes`)."""

from __future__ import annotations

import json
import math
import re
from itertools import compress
from operator import itemgetter
from typing import Any

from agent.core.errors import SeriesFormatError
from agent.detect.trend import _kernels
from agent.series.records import ImportResult, Problem, parse_number

# Prometheus names whose meaning equals one of medic's (see agent.core.catalog)
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


def looks_like_prometheus(text: str) -> bool:
    """A single JSON document with `data` and `resultType`, rather than one object per line."""
    first_line = text.lstrip().split("\n", 1)[0]
    try:
        first = json.loads(first_line)
    except (ValueError, RecursionError):
        head = text[:65536]
        return '"resultType"' in head and '"data"' in head  # a pretty-printed document
    return isinstance(first, dict) and "data" in first


def whole_document(text: str) -> Any:
    """The text as one JSON document, or None when it is not one. JSON Lines fail fast: the
    decoder stops at the end of the first line ("Extra data")."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def read_prometheus(text: str, source: str, result: ImportResult, strict: bool, label: str | None) -> None:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        line = getattr(exc, "lineno", None)
        msg = getattr(exc, "msg", None) or "not valid JSON"
        raise SeriesFormatError(
            f"{source}:{line or 1}: not valid JSON ({msg}); expected a Prometheus query_range export "
            "or JSON Lines"
        ) from None
    read_prometheus_doc(doc, source, result, strict, label)


def read_prometheus_doc(doc: Any, source: str, result: ImportResult, strict: bool, label: str | None) -> None:
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
        _read_entry(number, entry, source, result, strict, label)


def _read_entry(
    number: int, entry: Any, source: str, result: ImportResult, strict: bool, label: str | None
) -> None:
    """One series of `data.result` into `result`."""
    if not isinstance(entry, dict) or not isinstance(entry.get("metric"), dict):
        result.add_problem(
            Problem(source, None, f"series #{number}: expected {{'metric': {{labels}}, 'values': [...]}}"),
            strict,
        )
        return
    key = _series_key(number, entry["metric"], source, result, strict, label)
    if key is not None:
        instance, metric = key
        _add_values(
            entry.get("values"),
            instance,
            metric,
            f"series #{number} ({instance}, {metric})",
            source,
            result,
            strict,
        )


def _series_key(
    number: int, labels: dict[str, Any], source: str, result: ImportResult, strict: bool, label: str | None
) -> tuple[str, str] | None:
    """(instance, metric) of a series from its labels (which are remembered), or None with the
    problem reported."""
    instance = _instance_of(labels, label)
    metric = _metric_of(labels)
    if instance is None or metric is None:
        what = f"the label {label!r}" if label else "an instance label (instance, pod, name, job) or __name__"
        result.add_problem(
            Problem(
                source,
                None,
                f"series #{number} ({_short(labels)}) lacks {what}; use --label NAME to pick the label that names the instance",
            ),
            strict,
        )
        return None
    result.remember_labels(instance, labels)
    return instance, metric


# the opening of an export as Prometheus writes it, up to the first series of `data.result`
_EXPORT_HEAD = re.compile(
    r'\s*\{\s*"status"\s*:\s*"success"\s*,\s*"data"\s*:\s*\{\s*"resultType"\s*:\s*"matrix"\s*,'
    r'\s*"result"\s*:\s*\[\s*'
)
_BETWEEN = re.compile(r"\s*([,\]])\s*")
_DECODER = json.JSONDecoder()
# one series as Prometheus writes it: `{"metric": {labels}, "values": [...]}`, with JSON's
# whitespace only (`\s` would take spaces json refuses)
_ENTRY_OPEN = re.compile(r'\{[ \t\n\r]*"metric"[ \t\n\r]*:[ \t\n\r]*')
_ENTRY_VALUES = re.compile(r'[ \t\n\r]*,[ \t\n\r]*"values"[ \t\n\r]*:[ \t\n\r]*')
_ENTRY_CLOSE = re.compile(r"[ \t\n\r]*\}")
_VALUES_CLOSE = re.compile(r"\][ \t\n\r]*\]")


def _scanned_entry(
    text: str, position: int, ascii_text: bool
) -> tuple[dict[str, Any], bytes, bytes, int] | None:
    """(labels, times, values, the index after it) of the series at `position` when it has the
    layout Prometheus writes: the labels decoded by json, the values scanned by the C kernel
    `matrix_values` into bytes of doubles (the finite points, as `_values_fast` keeps them: a
    fifth of the time of decoding them into lists of strings). None for any other layout or
    anything the kernel does not take; the json decoder then reads the series and says what is
    wrong with it. The kernel indexes ASCII text: in other text (a label in UTF-8) it scans the
    slice up to the array's first `]]`, where a values array of that shape ends."""
    opening = _ENTRY_OPEN.match(text, position)
    if opening is None:
        return None
    try:
        labels, position = _DECODER.raw_decode(text, opening.end())
    except (ValueError, RecursionError):
        return None
    values = _ENTRY_VALUES.match(text, position) if isinstance(labels, dict) else None
    if values is None:
        return None
    start = values.end()
    if ascii_text:
        scanned = _kernels.matrix_values(text, start)
    else:
        close = _VALUES_CLOSE.search(text, start)
        scanned = _kernels.matrix_values(text[start : close.end()], 0) if close is not None else None
    if scanned is None:
        return None
    times, numbers, end = scanned
    closing = _ENTRY_CLOSE.match(text, end if ascii_text else start + end)
    return (labels, times, numbers, closing.end()) if closing is not None else None


def stream_prometheus(text: str, source: str, result: ImportResult, strict: bool, label: str | None) -> bool:
    """Read an export that opens as Prometheus writes it one series at a time, each series'
    decoded values dropped once its arrays are filled (the whole document decoded at once is
    five times the file's size in objects); False, with nothing added, when the text is not
    such an export or is broken somewhere (then the whole-document reader says where)."""
    head = _EXPORT_HEAD.match(text)
    if head is None:
        return False
    read = ImportResult()
    position, number = head.end(), 0
    if text.startswith("]", position):
        close = position
    else:
        scan = _kernels is not None and hasattr(_kernels, "matrix_values")
        ascii_text = text.isascii()
        while True:
            number += 1
            scanned = _scanned_entry(text, position, ascii_text) if scan else None
            if scanned is not None:
                labels, times, values, position = scanned
                key = _series_key(number, labels, source, read, strict, label)
                if key is not None and times:
                    column = read.column(*key)
                    column[0].frombytes(times)
                    column[1].frombytes(values)
                    read.points += len(times) // 8
            else:
                try:
                    entry, position = _DECODER.raw_decode(text, position)
                except (ValueError, RecursionError):
                    return False
                _read_entry(number, entry, source, read, strict, label)
            between = _BETWEEN.match(text, position)
            if between is None:
                return False
            if between[1] == "]":
                close = between.start(1)
                break
            position = between.end()
    # the rest of the document, after the series, parsed with them left out: it must be valid
    # JSON and not name another `result` (the last one would win)
    rest = whole_document('{"status": "success", "data": {"resultType": "matrix", "result": [' + text[close:])
    data = rest.get("data") if isinstance(rest, dict) else None
    if not isinstance(data, dict) or data.get("result") != []:
        return False
    read_prometheus_doc(rest, source, result, strict, label)  # its status and resultType
    result.merge(read)
    return True


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
        ts, ts_problem = parse_number(pair[0], "ts")
        value, value_problem = parse_number(pair[1], "value")
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


def _values_fast(values: list[Any]) -> tuple[list[float], list[float]] | None:
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
    try:
        if not all(map(math.isfinite, raw_times)):
            return None
    except OverflowError:  # an int time beyond a double's range
        return None
    if all(map(math.isfinite, numbers)):
        return raw_times, numbers
    kept = list(compress(range(len(numbers)), map(math.isfinite, numbers)))
    return list(map(raw_times.__getitem__, kept)), list(map(numbers.__getitem__, kept))


def _is_nan_or_inf(raw: Any) -> bool:
    """Prometheus writes NaN and ±Inf as strings; they are gaps, not errors."""
    return isinstance(raw, str) and raw.strip().lower().lstrip("+-") in ("nan", "inf")


def _instance_of(labels: dict[str, Any], label: str | None) -> str | None:
    names = (label,) if label else LABEL_FALLBACKS
    for name in names:
        value = labels.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def _metric_of(labels: dict[str, Any]) -> str | None:
    name = labels.get("__name__")
    if not isinstance(name, str) or not name:
        return None
    if name in PROMETHEUS_NAMES:
        return PROMETHEUS_NAMES[name]
    le = labels.get("le")
    if name.endswith("_bucket") and isinstance(le, str) and le:
        return f'{name}{{le="{le}"}}'  # one series per bound (`agent.series.buckets`)
    if name.startswith(MEDIC_PREFIX):
        return name[len(MEDIC_PREFIX) :]
    return name


def _short(labels: dict[str, Any]) -> str:
    text = ",".join(f"{k}={v}" for k, v in list(labels.items())[:4])
    return text[:80]
