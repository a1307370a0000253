"""Series pulled from a Prometheus server's HTTP API (`/api/v1/query_range`), into the same
`ImportResult` that `agent.series.prometheus` makes from an exported file.

The range is asked in chunks of `chunk_points` steps (Prometheus refuses more than 11,000 points
per series in one query), oldest first, each chunk starting one step after the last one ended so
no sample is read twice. Everything read is bounded: each answer's bytes while it streams, the
bytes and samples of the whole pull, the time of each request and of the whole pull. Going over
a bound, an unreachable server, an error answer or one that is not a `query_range` matrix raise
`SeriesFormatError` with what happened and what to change: a pull gives all its range or nothing.
"""

from __future__ import annotations

import json
import math
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from agent.core.errors import SeriesFormatError
from agent.series.prometheus import read_prometheus_doc
from agent.series.records import ImportResult

MAX_POINTS_PER_SERIES = 11_000  # Prometheus' own limit on one query_range
DEFAULT_CHUNK_POINTS = 1440  # a day at one minute: answers of a few MB for a hundred series


@dataclass(frozen=True)
class PullSpec:
    """One range pull: the server, the query and its range, how to authenticate, and the bounds."""

    url: str
    query: str
    start: float
    end: float
    step: float = 60.0
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold a bearer token
    ssl_context: ssl.SSLContext | None = None
    label: str | None = None  # the label naming the instance (default: instance, pod, name, job)
    metric: str | None = None  # the metric name of series without `__name__` (an expression's result)
    timeout: float = 30.0  # one request
    deadline: float = 300.0  # the whole pull
    max_samples: int = 5_000_000
    max_bytes: int = 1 << 30
    chunk_points: int = DEFAULT_CHUNK_POINTS

    def check(self) -> None:
        """`SeriesFormatError` when the spec itself cannot make a pull."""
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SeriesFormatError(f"Prometheus URL {self.url!r}: expected http(s)://HOST:PORT")
        if not self.query.strip():
            raise SeriesFormatError("the Prometheus query is empty; give a PromQL selector such as rss_bytes")
        if not (math.isfinite(self.start) and math.isfinite(self.end)) or self.end <= self.start:
            raise SeriesFormatError(
                f"the range is empty: start {self.start:.0f} is not before end {self.end:.0f}"
            )
        if not math.isfinite(self.step) or self.step <= 0:
            raise SeriesFormatError(f"the step must be positive, got {self.step}")
        if not 1 <= self.chunk_points <= MAX_POINTS_PER_SERIES:
            raise SeriesFormatError(f"chunk_points must be 1 to {MAX_POINTS_PER_SERIES}")


def chunks(start: float, end: float, step: float, points: int) -> list[tuple[float, float]]:
    """(start, end) of each request: `points` steps each, the last one ending at `end`, no overlap."""
    out = []
    width = step * (points - 1)
    at = start
    while at <= end:
        last = min(end, at + width)
        out.append((at, last))
        at = last + step
    return out


def pull_range(
    spec: PullSpec,
    *,
    strict: bool = False,
    progress: Callable[[int, int], None] | None = None,
    client: httpx.Client | None = None,
) -> ImportResult:
    """Every series `spec.query` gives over the range; `progress(chunks_done, chunks_total)`.
    Each instance's labels (its first series') are in `result.labels`."""
    spec.check()
    source = f"{spec.url.rstrip('/')} {spec.query!r}"
    pieces = chunks(spec.start, spec.end, spec.step, spec.chunk_points)
    started = time.monotonic()
    result = ImportResult()
    read_bytes = 0
    own = client is None
    http = client or httpx.Client(
        timeout=httpx.Timeout(spec.timeout), trust_env=False, verify=spec.ssl_context or True
    )
    try:
        for number, (first, last) in enumerate(pieces, 1):
            remaining = spec.deadline - (time.monotonic() - started)
            if remaining <= 0:
                raise SeriesFormatError(
                    f"{source}: the pull took over its {spec.deadline:g}s deadline after {number - 1} of "
                    f"{len(pieces)} chunks; narrow the query or the lookback, or raise the deadline"
                )
            over = (
                f"{source}: the pull took over its {spec.deadline:g}s deadline in chunk {number} of "
                f"{len(pieces)}; narrow the query or the lookback, or raise the deadline"
            )
            if remaining >= spec.timeout:
                over = f"{source}: no answer within {spec.timeout:g}s"
            body = _fetch(
                http, spec, first, last, spec.max_bytes - read_bytes, min(remaining, spec.timeout), over
            )
            read_bytes += len(body)
            doc = _decode(body, source)
            if spec.metric is not None:
                _name_series(doc, spec.metric)
            read_prometheus_doc(doc, f"{source} [{first:.0f}, {last:.0f}]", result, strict, spec.label)
            if result.points > spec.max_samples:
                raise SeriesFormatError(
                    f"{source}: over {spec.max_samples} samples after {number} of {len(pieces)} chunks; "
                    "narrow the query or the lookback, use a longer step, or raise max_samples"
                )
            if progress is not None:
                progress(number, len(pieces))
    finally:
        if own:
            http.close()
    return result


def _fetch(
    http: httpx.Client, spec: PullSpec, first: float, last: float, budget: int, timeout: float, late: str
) -> bytes:
    """One answer's body, read while it streams and cut off at `budget` bytes; `late`: the error
    when it does not arrive within `timeout`."""
    source = late.split(": ", 1)[0]
    url = spec.url.rstrip("/") + "/api/v1/query_range"
    form = {"query": spec.query, "start": f"{first:.3f}", "end": f"{last:.3f}", "step": f"{spec.step:g}s"}
    deadline = time.monotonic() + timeout
    try:
        with http.stream(
            "POST", url, data=form, headers=dict(spec.headers), timeout=httpx.Timeout(timeout)
        ) as response:
            parts: list[bytes] = []
            size = 0
            for part in response.iter_bytes():
                size += len(part)
                if size > budget:
                    raise SeriesFormatError(
                        f"{source}: the answers are over the {spec.max_bytes}-byte bound; narrow the query "
                        "or the lookback, use a longer step, or raise max_bytes"
                    )
                if time.monotonic() > deadline:
                    raise SeriesFormatError(late)
                parts.append(part)
            body = b"".join(parts)
            status = response.status_code
    except httpx.TimeoutException:
        raise SeriesFormatError(late) from None
    except httpx.HTTPError as exc:
        raise SeriesFormatError(
            f"{source}: cannot reach Prometheus ({exc.__class__.__name__}: {exc}); check the URL and the TLS settings"
        ) from None
    if status >= 400:
        raise SeriesFormatError(f"{source}: Prometheus answered HTTP {status}: {_error_of(body)}")
    return body


def _error_of(body: bytes) -> str:
    """Prometheus' own error message from an error answer, or the start of the body."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return repr(body[:200].decode("utf-8", "replace"))
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return f"{doc.get('errorType', 'error')}: {doc['error'][:300]}"
    return repr(body[:200].decode("utf-8", "replace"))


def _decode(body: bytes, source: str) -> object:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise SeriesFormatError(
            f"{source}: the answer is not JSON ({body[:80].decode('utf-8', 'replace')!r}); is this the "
            "URL of a Prometheus server (its /api/v1/query_range)?"
        ) from None


def _name_series(doc: object, metric: str) -> None:
    """Give series without `__name__` (the result of an expression) the configured metric name."""
    data = doc.get("data") if isinstance(doc, dict) else None
    entries = data.get("result") if isinstance(data, dict) else None
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("metric"), dict):
            entry["metric"].setdefault("__name__", metric)
