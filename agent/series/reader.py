"""Offline readers of recorded memory series for `medic analyze` and the benchmark.

Two formats, told apart by their first non-blank character (the readers are
`agent.series.jsonl` and `agent.series.prometheus`, their result `agent.series.records`):

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
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.core.bounded import read_regular_file
from agent.core.errors import SeriesFormatError, UnsafePath
from agent.series.jsonl import read_jsonl
from agent.series.prometheus import (
    looks_like_prometheus,
    read_prometheus,
    read_prometheus_doc,
    stream_prometheus,
    whole_document,
)
from agent.series.records import ImportResult, Problem

# what one input file may hold once decompressed: 14 days of 100 instances' histograms is about
# 0.9 GB, and reading takes about twice that in memory; a gzip bomb or /dev/zero stops here
MAX_INPUT_BYTES = 4 * 2**30


def read_files(
    paths: Iterable[str | Path],
    *,
    strict: bool = False,
    label: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ImportResult:
    """Read every file into one result; `progress(bytes_done, bytes_total)` as it goes."""
    files = [Path(p) for p in paths]
    sizes = []
    for path in files:
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
        for path, size in zip(files, sizes, strict=True):
            text = _read_text(path)
            read_text(text, str(path), result, strict=strict, label=label)
            del text  # before the next file is read
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
    if head == "{" and stream_prometheus(text, source, result, strict, label):
        return result
    doc = whole_document(text) if head == "{" else None
    if isinstance(doc, dict) and "data" in doc:
        read_prometheus_doc(doc, source, result, strict, label)
    elif doc is None and head == "{" and looks_like_prometheus(text):
        read_prometheus(text, source, result, strict, label)  # says where the document is broken
    else:
        read_jsonl(text, source, result, strict)
    return result


# ---------------------------------------------------------------------------------------------
# files


def _gunzip(data: bytes, limit: int) -> bytes:
    """gzip members in a row, decompressed to at most `limit` bytes (a bomb stops there); EOFError
    when the last member is cut short, as `gzip.decompress` says it."""
    out: list[bytes] = []
    produced = 0
    while data and produced < limit:
        inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
        piece = inflate.decompress(data, limit - produced)
        out.append(piece)
        produced += len(piece)
        if produced >= limit:
            break
        if not inflate.eof:
            raise EOFError("compressed file ended before the end-of-stream marker was reached")
        data = inflate.unused_data.lstrip(b"\x00")  # gzip allows zero padding between members
    return b"".join(out)


def _read_text(path: Path, max_bytes: int | None = None) -> str:
    """The file's text, gunzipped when it is gzip; a FIFO, socket or device is refused before it can
    block, and more than `max_bytes` (compressed or not) is refused instead of filling memory."""
    max_bytes = MAX_INPUT_BYTES if max_bytes is None else max_bytes
    try:
        try:
            raw = read_regular_file(path, max_bytes)
        except UnsafePath as exc:
            raise SeriesFormatError(str(exc)) from None
        if raw[:2] == b"\x1f\x8b":
            raw = _gunzip(raw, max_bytes + 1)
        if len(raw) > max_bytes:
            raise SeriesFormatError(
                f"{path}: more than {max_bytes // 2**20} MiB of series (decompressed); split the export "
                "by time or by instance"
            )
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


__all__ = ["ImportResult", "Problem", "collector_paused", "read_files", "read_text"]
