"""The JSON Lines reader: one object per line, `{"ts": <unix s>, "instance": "...", "metric":
"rss_bytes", "value": <number>}` (extra keys are ignored; numbers may be numeric strings)."""

from __future__ import annotations

import json
import math
import operator
from collections import deque
from operator import itemgetter
from typing import Any

from agent.series.records import ImportResult, Problem, parse_number

_call = getattr(operator, "call", lambda function, arg: function(arg))  # operator.call is 3.11+
CHUNK_CHARS = 1 << 21  # JSON Lines are parsed about this many characters at a time (one json.loads each)
_NUMBERS = {int, float}  # JSON numbers (a bool is not one)


def read_jsonl(text: str, source: str, result: ImportResult, strict: bool) -> None:
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
    ts, ts_problem = parse_number(record["ts"], "ts")
    value, value_problem = parse_number(record["value"], "value")
    problem = ts_problem or value_problem
    if problem:
        result.add_problem(Problem(source, lineno, problem), strict)
        return
    times, values = result.column(instance, metric)
    times.append(ts)
    values.append(value)
    result.points += 1


_JSONL_SHAPE = '{"ts": <unix seconds>, "instance": "...", "metric": "rss_bytes", "value": <number>}'
