"""Parsers of heap-profile dumps: jemalloc `heap_v2` and gperftools `heap profile:` files.

Both formats list backtraces (return addresses, innermost first) with the objects and bytes
allocated there and still live, then `MAPPED_LIBRARIES:` and a copy of `/proc/self/maps` taken at
dump time, which lets medic symbolize a dump after the process is gone (REFERENCE §1.9, §2.3).

- jemalloc counts are **samples** (one every ~2^lg_prof_sample bytes): they are un-biased here the
  way jeprof does it, scale = 1 / (1 - exp(-(bytes/objects) / period)).
- gperftools `@ heapprofile` counts are exact; a `@ heap_v2/N` header (sampled) is un-biased the same way.

A dump that is cut short (no `MAPPED_LIBRARIES:` section, no final newline, a backtrace without its
counts) or malformed raises `HeapProfileError` naming the file and line: it is never half-read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, NoReturn

from agent.core.bounded import read_regular_file
from agent.core.errors import ProbeError, UnsafePath
from agent.core.figures import decimal
from probes.linux.fstrust import open_owned_file
from probes.linux.maps import Mapping, parse_maps_line

MAX_PROFILE_BYTES = 512 * 2**20  # larger dumps are refused rather than read into memory
MAX_FRAMES = 512  # jemalloc's own limit is 128 (PROF_BT_MAX)

Format = Literal["jemalloc", "gperftools"]

_HEX = r"0x[0-9a-fA-F]+"
_COUNTS = r"(\d+):\s*(\d+)\s*\[\s*(\d+):\s*(\d+)\s*\]"
_JE_HEADER = re.compile(r"heap_v2/(\d+)")
_JE_COUNTS = re.compile(r"\s*t(\*|\d+):\s*" + _COUNTS)
_JE_STACK = re.compile(rf"@((?:\s+{_HEX})+)\s*")
_GP_HEADER = re.compile(r"heap profile:\s*" + _COUNTS + r"\s*@\s*(heapprofile|heap_v2/(\d+))\s*")
_GP_STACK = re.compile(r"\s*" + _COUNTS + rf"\s*@((?:\s+{_HEX})*)\s*")
_JE_FAST_THREADS = r"(?:  t\d+: \d+: \d+ \[\d+: \d+\]\n)*"
_JE_FAST_HEAD = re.compile(r"heap_v2/(\d+)\n  t\*: \d+: \d+ \[\d+: \d+\]\n" + _JE_FAST_THREADS)
_JE_FAST_RECORD = re.compile(
    r"@((?: 0x[0-9a-fA-F]+)+)\n  t\*: (\d+): (\d+) \[(\d+): (\d+)\]\n" + _JE_FAST_THREADS + r"\n*"
)
MAPS_MARKER = "MAPPED_LIBRARIES:"
COUNTER_LIMIT = 2**64  # every count, size and sample period in a dump is a 64-bit counter
_hex = partial(int, base=16)


class HeapProfileError(ProbeError):
    """A heap-profile file is truncated, corrupt or of an unknown format."""

    reason = "corrupt"


class HeapProfileRefused(HeapProfileError):
    """A dump medic will not read: a symlink, not a regular file, another user's, or too large."""

    reason = "unsafe"


@dataclass(frozen=True, slots=True)
class StackRecord:
    """Live (and, when the allocator keeps them, cumulative) objects and bytes of one backtrace."""

    frames: tuple[int, ...]
    live_objects: float
    live_bytes: float
    alloc_objects: float = 0.0
    alloc_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class HeapProfile:
    format: Format
    sample_period: int  # bytes between samples; 0 when counts are exact
    stacks: tuple[StackRecord, ...]
    mappings: tuple[Mapping, ...]
    source: str = "<profile>"

    @property
    def live_bytes(self) -> float:
        return sum(s.live_bytes for s in self.stacks)

    @property
    def live_objects(self) -> float:
        return sum(s.live_objects for s in self.stacks)


def read_heap_profile(path: str | Path, owners: Collection[int] | None = None) -> HeapProfile:
    """Read and parse one dump; `HeapProfileError` for unreadable, oversized, truncated or corrupt files.

    With `owners` (the uids of the target that wrote it and of medic), the dump is a file the target
    controls: it is opened without following a symlink and must be a regular file owned by one of them
    (`HeapProfileRefused` otherwise), so a planted link cannot make a root medic read another file.
    """
    path = Path(path)
    if owners is not None:
        try:
            data = open_owned_file(path, owners, MAX_PROFILE_BYTES)
        except UnsafePath as exc:
            raise HeapProfileRefused(f"heap profile refused: {exc}") from None
        except OSError as exc:
            raise HeapProfileError(f"cannot read heap profile {path}: {exc.strerror or exc}") from None
        return parse_heap_profile(data, str(path))
    try:
        size = path.stat().st_size
        if size > MAX_PROFILE_BYTES:
            raise HeapProfileError(
                f"{path}: {size} bytes is larger than the {MAX_PROFILE_BYTES >> 20} MiB medic reads; "
                "raise lg_prof_sample (jemalloc) or profile fewer allocations"
            )
        data = read_regular_file(path, MAX_PROFILE_BYTES)  # a FIFO or a device is refused, not waited on
    except UnsafePath as exc:
        raise HeapProfileError(f"cannot read heap profile: {exc}") from None
    except OSError as exc:
        raise HeapProfileError(f"cannot read heap profile {path}: {exc.strerror or exc}") from None
    return parse_heap_profile(data, str(path))


def parse_heap_profile(data: bytes | str, source: str = "<profile>") -> HeapProfile:
    """Parse a jemalloc heap_v2 or gperftools heap profile; the format is read from the first line."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HeapProfileError(
                f"{source}: byte {exc.start} is not text: not a heap profile, or a corrupt one"
            ) from None
    else:
        text = data
    if not text.strip():
        raise HeapProfileError(f"{source}: empty file: the dump was not written (yet); retry later")
    first = text.split("\n", 1)[0]
    if first.startswith("heap_v2/"):
        parser = _parse_jemalloc
    elif first.startswith("heap profile:"):
        parser = _parse_gperftools
    else:
        raise HeapProfileError(
            f"{source}:1: not a heap profile: starts with {first[:60]!r}; expected 'heap_v2/N' (jemalloc "
            "prof.dump) or 'heap profile: …' (gperftools HEAPPROFILE)"
        )
    if not text.endswith("\n"):
        raise HeapProfileError(
            f"{source}: truncated: the last line has no newline; the dump was cut short or is still being "
            "written (retry later)"
        )
    body, maps_at = _split_maps(text, source)
    fast = _fast_jemalloc(body, source) if parser is _parse_jemalloc else None
    if fast is not None:
        format_, period, stacks = fast
    else:  # line by line: slower, and says where a bad line is
        format_, period, stacks = parser(body.split("\n"), source)
    mappings = tuple(_parse_maps(text, maps_at, source))
    return HeapProfile(format_, period, tuple(stacks), mappings, source)


def _split_maps(text: str, source: str) -> tuple[str, int]:
    """The profile part and the line number where `MAPPED_LIBRARIES:` starts."""
    marker = text.find("\n" + MAPS_MARKER + "\n")
    if marker < 0:
        raise HeapProfileError(
            f"{source}: truncated: no {MAPS_MARKER} section at the end; the dump was cut short or is still "
            "being written (retry later)"
        )
    return text[:marker], text.count("\n", 0, marker) + 2


def _parse_jemalloc(lines: list[str], source: str) -> tuple[Format, int, list[StackRecord]]:
    header = _JE_HEADER.fullmatch(lines[0].strip())
    if header is None:
        _fail(source, 1, lines[0], "expected 'heap_v2/<sample period>'")
    (period,) = _counters(header.group(1), source=source, number=1, line=lines[0])
    stacks: list[StackRecord] = []
    i = 1
    i = _skip_thread_lines(lines, i, source, need_total=True)  # the totals over all backtraces
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        match = _JE_STACK.fullmatch(line)
        if match is None:
            _fail(source, i + 1, line, "expected a backtrace '@ 0x… 0x…'")
        frames = _frames(match.group(1), source, i + 1)
        if i + 1 >= len(lines):
            _fail(source, i + 1, line, "truncated: a backtrace without its 't*:' counts")
        counts = _JE_COUNTS.fullmatch(lines[i + 1])
        if counts is None or counts.group(1) != "*":
            _fail(source, i + 2, lines[i + 1], "expected the backtrace's counts 't*: objects: bytes [ … ]'")
        live_n, live_b, acc_n, acc_b = _counters(
            *counts.group(2, 3, 4, 5), source=source, number=i + 2, line=lines[i + 1]
        )
        stacks.append(StackRecord(frames, *_unbias(live_n, live_b, period), *_unbias(acc_n, acc_b, period)))
        i = _skip_thread_lines(lines, i + 2, source, need_total=False)
    return "jemalloc", period, stacks


def _fast_jemalloc(body: str, source: str) -> tuple[Format, int, list[StackRecord]] | None:
    """The common case in one regex pass (about twice as fast); None when anything is unusual."""
    text = body if body.endswith("\n") else body + "\n"
    head = _JE_FAST_HEAD.match(text)
    if head is None:
        return None
    period = int(head.group(1))
    if period >= COUNTER_LIMIT:
        return None  # the line-by-line parser names the line
    stacks = []
    pos = head.end()
    for match in _JE_FAST_RECORD.finditer(text, pos):
        if match.start() != pos:
            return None
        try:
            frames = _frames(match.group(1), source, 0)
        except HeapProfileError:
            return None  # the line-by-line parser names the line
        live_n, live_b, acc_n, acc_b = map(int, match.group(2, 3, 4, 5))
        if max(live_n, live_b, acc_n, acc_b) >= COUNTER_LIMIT:
            return None
        stacks.append(StackRecord(frames, *_unbias(live_n, live_b, period), *_unbias(acc_n, acc_b, period)))
        pos = match.end()
    if text[pos:].strip():
        return None
    return "jemalloc", period, stacks


def _skip_thread_lines(lines: list[str], i: int, source: str, need_total: bool) -> int:
    """Skip per-thread count lines (`t0: …`); with `need_total`, the first must be `t*:`."""
    if need_total:
        if i >= len(lines) or not (match := _JE_COUNTS.fullmatch(lines[i])) or match.group(1) != "*":
            _fail(
                source, i + 1, lines[i] if i < len(lines) else "", "expected the totals 't*: objects: bytes'"
            )
        i += 1
    while i < len(lines) and lines[i].lstrip().startswith("t"):
        if _JE_COUNTS.fullmatch(lines[i]) is None:
            _fail(source, i + 1, lines[i], "expected per-thread counts 't<N>: objects: bytes [… : …]'")
        i += 1
    return i


def _parse_gperftools(lines: list[str], source: str) -> tuple[Format, int, list[StackRecord]]:
    header = _GP_HEADER.fullmatch(lines[0])
    if header is None:
        _fail(
            source,
            1,
            lines[0],
            "expected 'heap profile: N: B [N: B] @ heapprofile' (or '@ heap_v2/PERIOD'); other kinds of "
            "pprof heap profiles are not supported",
        )
    *_, period = _counters(
        *header.group(1, 2, 3, 4), header.group(6) or "0", source=source, number=1, line=lines[0]
    )
    stacks = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        match = _GP_STACK.fullmatch(line)
        if match is None:
            _fail(source, number, line, "expected 'objects: bytes [objects: bytes] @ 0x…'")
        live_n, live_b, acc_n, acc_b = _counters(
            *match.group(1, 2, 3, 4), source=source, number=number, line=line
        )
        frames = _frames(match.group(5), source, number)
        stacks.append(StackRecord(frames, *_unbias(live_n, live_b, period), *_unbias(acc_n, acc_b, period)))
    return "gperftools", period, stacks


def _frames(text: str, source: str, number: int) -> tuple[int, ...]:
    words = text.split()
    if len(words) > MAX_FRAMES:
        raise HeapProfileError(
            f"{source}:{number}: {len(words)} frames in one backtrace (at most {MAX_FRAMES})"
        )
    frames = tuple(map(_hex, words))  # the line's regex already checked every word is 0x + hex digits
    if frames and max(frames) >= 2**64:
        raise HeapProfileError(f"{source}:{number}: an address is wider than 64 bits: corrupt dump")
    return frames


def _counters(*digits: str, source: str, number: int, line: str) -> tuple[int, ...]:
    """The line's counts as ints, each below 2**64 (a wider one would also overflow a float)."""
    values = tuple(v for v in (decimal(d, COUNTER_LIMIT) for d in digits) if v is not None)
    if len(values) != len(digits):
        _fail(source, number, line, "a count, size or sample period wider than 64 bits")
    return values


def _unbias(objects: int, size: int, period: int) -> tuple[float, float]:
    """Estimated true counts from sampled ones (a Poisson process of rate 1/period bytes)."""
    if period <= 1 or objects == 0:
        return float(objects), float(size)
    ratio = size / objects / period
    scale = 1.0 / -math.expm1(-ratio) if ratio > 0 else 1.0
    return objects * scale, size * scale


def _parse_maps(text: str, first_line: int, source: str) -> Iterator[Mapping]:
    lines = text.split("\n")[first_line:]
    for number, line in enumerate(lines, start=first_line + 1):
        if not line.strip():
            continue
        mapping = parse_maps_line(line)
        if mapping is None:
            _fail(
                source, number, line, "expected a /proc/PID/maps line 'start-end perms offset dev inode path'"
            )
        yield mapping


def _fail(source: str, number: int, line: str, expected: str) -> NoReturn:
    raise HeapProfileError(f"{source}:{number}: {expected}, got {line[:80]!r}: truncated or corrupt dump")
