"""Pure parsers of `jcmd` output: `GC.class_histogram`, `GC.heap_info`, `VM.native_memory summary`, the
three together from `jcmd PID -f FILE`, and jcmd's attach failures (REFERENCE §7).

Formats verified on OpenJDK 17 and 25 (G1, Parallel, Serial, ZGC, Shenandoah); the captured outputs
are in `tests/fixtures/jvm/`. A histogram without its header or its `Total` line is truncated and
rejected; single odd rows are skipped and counted, never guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.core.errors import ProbeAccessDenied, ProbeError, ProbeUnavailable, TargetGone
from agent.core.figures import FIGURE_LIMIT, decimal

KIB = 1024
_UNITS = {"": 1, "B": 1, "K": KIB, "KB": KIB, "M": KIB**2, "MB": KIB**2, "G": KIB**3, "GB": KIB**3}
MAX_BAD_ROWS = 10  # more odd rows than this (and than 10 % of the rows) is not a histogram
_ROW = re.compile(r"\s*(\d+):\s+(\d+)\s+(\d+)\s+(\S+)(?:\s+\((.*)\))?\s*")
_TOTAL = re.compile(r"Total\s+(\d+)\s+(\d+)\s*")
_HISTO_HEADER = re.compile(r"\s*num\s+#instances\s+#bytes\s+class name.*")
_SIZE = r"(\d+)([KMG]?B?)"
_GEN = re.compile(
    r"\s*(?P<name>[A-Za-z][\w -]*?)\s+total\s+(?:reserved\s+\d+[KMG]?,\s+committed\s+)?"
    rf"{_SIZE},\s+used\s+{_SIZE}"
)
_SPACE = re.compile(rf"\s*(?P<name>eden|from|to)\s+space\s+{_SIZE},\s+(?P<pct>\d+)%\s+used")
_G1_REGIONS = re.compile(
    rf"\s*region size\s+{_SIZE},\s+\d+\s+young\s+\({_SIZE}\),\s+\d+\s+survivors\s+\({_SIZE}\)"
)
_ZHEAP = re.compile(rf"\s*ZHeap\s+used\s+{_SIZE},\s+capacity\s+{_SIZE}")
_SHENANDOAH = re.compile(rf"\s*{_SIZE}\s+max,.*?{_SIZE}\s+committed,\s+{_SIZE}\s+used")
_METASPACE = re.compile(rf"\s*Metaspace\s+used\s+{_SIZE},\s+committed\s+{_SIZE}")
# the heap's address range, as a generation line ends: `[start, end)` or `[start, committed, end)`
_SPAN = re.compile(r".*\[(0x[0-9a-fA-F]{1,16}),(?:\s*0x[0-9a-fA-F]{1,16},)?\s*(0x[0-9a-fA-F]{1,16})\)\s*")
_NMT_TOTAL = re.compile(r"Total:\s+reserved=(\d+)(KB|MB|GB|B)?,\s+committed=(\d+)(KB|MB|GB|B)?")
_NMT_MALLOC = re.compile(r"\s*malloc:\s+(\d+)(KB|MB|GB|B)?\b")
_NMT_CATEGORY = re.compile(
    r"-\s+(?P<name>.+?)\s+\(reserved=(\d+)(KB|MB|GB|B)?,\s+committed=(\d+)(KB|MB|GB|B)?"
)
NMT_OFF = "Native memory tracking is not enabled"


def _bytes(number: str, unit: str | None) -> int:
    size = _count(number) * _UNITS[(unit or "").upper()]
    if size >= FIGURE_LIMIT:
        raise JcmdOutputError(f"a size wider than 64 bits ({number}{unit}): not jcmd's output")
    return size


def _count(number: str) -> int:
    """A figure jcmd printed: a JVM counter is 64 bits, so a wider one means the output is not jcmd's
    (and would overflow the store and every float after it)."""
    value = decimal(number)
    if value is None:
        shown = number if len(number) <= 24 else number[:24] + "…"
        raise JcmdOutputError(f"a figure wider than 64 bits ({shown}): not jcmd's output")
    return value


class JcmdOutputError(ProbeError):
    """jcmd answered with something that is not the expected report."""

    reason = "corrupt"


# ------------------------------------------------------------------------------- class histogram
@dataclass(frozen=True, slots=True)
class ClassRow:
    name: str
    instances: int
    bytes: int
    module: str | None


@dataclass(frozen=True, slots=True)
class ClassHistogram:
    rows: list[ClassRow]
    total_instances: int
    total_bytes: int
    bad_rows: int = 0


def find_histogram(text: str) -> tuple[int, int] | None:
    """Line span [start, end] of a class histogram (header to `Total`), or None when there is none."""
    lines = text.splitlines()
    for start, line in enumerate(lines):
        if _HISTO_HEADER.fullmatch(line):
            for end in range(start + 1, len(lines)):
                if lines[end].startswith("Total"):
                    return start, end
            return start, len(lines)
    return None


def parse_class_histogram(text: str, source: str = "GC.class_histogram") -> ClassHistogram:
    """Rows (rank, instances, bytes, class, module) and the `Total` line; `JcmdOutputError` if truncated."""
    lines = text.splitlines()
    span = find_histogram(text)
    if span is None:
        raise JcmdOutputError(
            f"{source}: no class histogram header ('num #instances #bytes class name') in the output"
        )
    start, end = span
    if end >= len(lines):
        raise JcmdOutputError(
            f"{source}: truncated class histogram: no 'Total' line after {len(lines)} lines"
        )
    total = _TOTAL.fullmatch(lines[end])
    if total is None:
        raise JcmdOutputError(
            f"{source}:{end + 1}: expected 'Total <instances> <bytes>', got {lines[end][:80]!r}"
        )
    rows, bad = [], 0
    for line in lines[start + 1 : end]:
        if not line.strip() or set(line.strip()) == {"-"}:
            continue
        match = _ROW.fullmatch(line)
        if match is None:
            bad += 1
            continue
        try:
            rows.append(
                ClassRow(match.group(4), _count(match.group(2)), _count(match.group(3)), match.group(5))
            )
        except JcmdOutputError:
            bad += 1
    if bad > MAX_BAD_ROWS and bad > len(rows) // 10:
        raise JcmdOutputError(
            f"{source}: {bad} of {bad + len(rows)} rows are not histogram rows: not a class histogram"
        )
    try:
        instances, size = _count(total.group(1)), _count(total.group(2))
    except JcmdOutputError as exc:
        raise JcmdOutputError(f"{source}:{end + 1}: {exc}") from None
    return ClassHistogram(rows, instances, size, bad)


# ------------------------------------------------------------------------------- heap info
@dataclass(frozen=True, slots=True)
class HeapInfo:
    collector: str
    used: int
    committed: int
    after_gc: int | None  # what survived the last young collection (None: no generations to tell)
    metaspace_used: int | None = None
    metaspace_committed: int | None = None
    span: tuple[int, int] | None = None  # the heap's reserved addresses [start, end), where it says


def parse_heap_info(text: str, source: str = "GC.heap_info") -> HeapInfo:
    """Heap figures of G1, Parallel, Serial, ZGC and Shenandoah reports.

    `after_gc` estimates the heap after the last young collection: G1 `used - eden`, Parallel/Serial
    `old used + survivor used`; the leak detector reads it through its lower envelope.
    """
    lines = text.splitlines()
    meta_used = meta_committed = None
    for line in lines:
        if match := _METASPACE.match(line):
            meta_used, meta_committed = _bytes(*match.group(1, 2)), _bytes(*match.group(3, 4))
    gens = {}
    spaces: dict[str, tuple[int, int]] = {}
    region = None
    spans = []
    for line in lines:
        if match := _GEN.match(line):
            gens[match.group("name").strip()] = (_bytes(*match.group(2, 3)), _bytes(*match.group(4, 5)))
            spans.append(_SPAN.fullmatch(line))
        elif line.lstrip().startswith("- [") and (found := _SPAN.fullmatch(line)):
            spans.append(found)  # Shenandoah's reserved range
        elif match := _SPACE.match(line):
            spaces.setdefault(match.group("name"), (_bytes(*match.group(2, 3)), int(match.group("pct"))))
        elif match := _G1_REGIONS.match(line):
            region = (_bytes(*match.group(3, 4)), _bytes(*match.group(5, 6)))
    span = _span(spans)
    if "garbage-first heap" in gens:
        committed, used = gens["garbage-first heap"]
        after = max(0, used - (region[0] - region[1])) if region else None
        return HeapInfo("G1", used, committed, after, meta_used, meta_committed, span)
    young = gens.get("PSYoungGen") or gens.get("def new generation")
    old = gens.get("ParOldGen") or gens.get("tenured generation")
    if young and old:
        size, pct = spaces.get("from", (0, 0))
        collector = "Parallel" if "PSYoungGen" in gens else "Serial"
        return HeapInfo(
            collector,
            young[1] + old[1],
            young[0] + old[0],
            old[1] + size * pct // 100,
            meta_used,
            meta_committed,
            span,
        )
    for line in lines:
        if match := _ZHEAP.match(line):
            return HeapInfo(
                "Z", _bytes(*match.group(1, 2)), _bytes(*match.group(3, 4)), None, meta_used, meta_committed
            )
        if match := _SHENANDOAH.match(line):
            used, committed = _bytes(*match.group(5, 6)), _bytes(*match.group(3, 4))
            return HeapInfo("Shenandoah", used, committed, None, meta_used, meta_committed, span)
    raise JcmdOutputError(
        f"{source}: no heap figures recognised (G1, Parallel, Serial, ZGC or Shenandoah); first line "
        f"{(lines[1] if len(lines) > 1 else text)[:80]!r}"
    )


def _span(found: list[re.Match[str] | None]) -> tuple[int, int] | None:
    """The addresses every generation's range covers; None when a generation names no range."""
    if not found or any(match is None for match in found):
        return None
    starts = [int(m.group(1), 16) for m in found if m is not None]
    ends = [int(m.group(2), 16) for m in found if m is not None]
    return (min(starts), max(ends)) if min(starts) < max(ends) else None


# ------------------------------------------------------------------------------- native memory tracking
@dataclass(frozen=True, slots=True)
class NativeMemory:
    reserved: int
    committed: int
    malloc: int | None
    categories: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (reserved, committed)

    @property
    def heap_committed(self) -> int | None:
        category = self.categories.get("Java Heap")
        return category[1] if category else None


def parse_native_memory(text: str, source: str = "VM.native_memory summary") -> NativeMemory | None:
    """NMT summary figures, or None when the JVM runs without `-XX:NativeMemoryTracking`."""
    if NMT_OFF in text:
        return None
    total = malloc = None
    categories: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        if total is None and (match := _NMT_TOTAL.match(line.strip())):
            total = (
                _bytes(match.group(1), match.group(2) or "KB"),
                _bytes(match.group(3), match.group(4) or "KB"),
            )
        elif malloc is None and total is not None and (match := _NMT_MALLOC.match(line)):
            malloc = _bytes(match.group(1), match.group(2) or "KB")
        elif match := _NMT_CATEGORY.match(line):
            categories[match.group("name").strip()] = (
                _bytes(match.group(2), match.group(3) or "KB"),
                _bytes(match.group(4), match.group(5) or "KB"),
            )
    if total is None:
        raise JcmdOutputError(f"{source}: no 'Total: reserved=…, committed=…' line: not an NMT summary")
    return NativeMemory(total[0], total[1], malloc, categories)


# ------------------------------------------------------------------------------- combined output
@dataclass(frozen=True, slots=True)
class JcmdReport:
    heap_info: str | None
    native_memory: str | None
    class_histogram: str | None


def split_report(text: str) -> JcmdReport:
    """Cut the output of `jcmd PID -f FILE` (heap_info, native_memory, class_histogram, in that order)
    into its parts; a part that is missing is None."""
    lines = text.splitlines()
    body = lines[1:] if lines and re.fullmatch(r"\d+:", lines[0].strip()) else lines
    histo_at = next((i for i, line in enumerate(body) if _HISTO_HEADER.fullmatch(line)), len(body))
    nmt_at = next(
        (
            i
            for i, line in enumerate(body[:histo_at])
            if line.startswith(("Native Memory Tracking:", NMT_OFF))
        ),
        histo_at,
    )
    heap = "\n".join(body[:nmt_at]).strip()
    nmt = "\n".join(body[nmt_at:histo_at]).strip()
    histo = "\n".join(body[histo_at:]).strip()
    return JcmdReport(heap or None, nmt or None, histo or None)


# ------------------------------------------------------------------------------- attach failures
def attach_failure(pid: int, returncode: int, stdout: str, stderr: str) -> ProbeError:
    """The probe error for a failed jcmd run, saying what to do about it."""
    text = f"{stderr}\n{stdout}"
    if "does not support the attach mechanism" in text:
        return ProbeUnavailable(
            f"the JVM {pid} refuses attach (-XX:+DisableAttachMechanism): no class histograms; remove that "
            "flag to let medic read them"
        )
    if "is not secure" in text or "Permission denied" in text or "Operation not permitted" in text:
        return ProbeAccessDenied(
            f"cannot attach to the JVM {pid}: jcmd must run as the JVM's user or as root "
            f"({_first_error(text)})"
        )
    if "No such process" in text:
        return TargetGone(f"the JVM {pid} is gone")
    if "Unable to open socket file" in text or "doesn't respond" in text:
        return ProbeError(
            f"the JVM {pid} did not answer the attach request: it may be hung, stopped, or in a container "
            f"whose /tmp medic cannot see ({_first_error(text)})"
        )
    return ProbeError(f"jcmd failed on the JVM {pid} (exit {returncode}): {_first_error(text)}")


def _first_error(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("at ") and not re.fullmatch(r"\d+:", line):
            return line[:300]
    return "no message"
