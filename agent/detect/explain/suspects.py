"""Suspects: the classes, types and allocation sites whose growth explains a process's growth.

Each name's bytes and count across the snapshots of the current process lifetime are judged with the
leak detector's robust trend test (`agent.detect.trend`: level shifts removed, Theil-Sen slope,
Mann-Kendall confidence corrected for autocorrelation). A suspect grows in bytes **and** in count,
confidently, well clear of its scatter, with a floor that rises block after block, and without
levelling off (`agent.detect.explain.sustained`). Garbage counted by `GC.class_histogram -all` lands anywhere
in its range at each snapshot: a few snapshots of it can fool a trend test, rarely all four checks.

JVM classes are judged on their post-GC floor: the live histogram when there are enough of those,
else, from `-all` histograms, each class's minimum over its later snapshots (whatever a collection in
between freed was garbage; what survives all of them is the floor). Request garbage (`[F`, short-lived
helpers) rises and falls with the GC sawtooth and its floor does not grow; a class that accumulates
keeps a rising floor.

Platform classes and builtins that grow in step with an application class (its `byte[]`, its map
nodes) are folded into it, so that the class on-call must look for is named first, even when that
class's own exact count stalled with its process and only its payload passed the test.

For growth outside the Java heap (`native=True`), what grows in the heap is tiny: the useful suspect is
the class whose live count rises with the native bytes (zip streams, direct buffers, JNI handles). Such
classes rank first, by the correlation of their count floor with the RSS floor, which each shows.

The share of growth explained is the suspect's slope over the process's growth in the same span:
the first steadily growing series of the kind's reference list (JVM classes: heap after GC, then
RSS; Python types, containers and native sites: allocator live bytes, then RSS), else the growth of the
histogram's total, else of the suspects together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.core.histograms import Snapshot
from agent.core.units import format_bytes
from agent.detect.explain.sustained import MIN_CONFIDENCE, MIN_POINTS, growth
from agent.detect.model import Points
from agent.detect.trend import theil_sen
from agent.state.store import Store

REFERENCES = {
    "class": ("jvm_heap_after_gc_bytes", "jvm_heap_used_bytes", "rss_bytes"),
    "type": ("allocator_allocated_bytes", "rss_bytes"),
    "container": ("allocator_allocated_bytes", "rss_bytes"),
    "site": ("allocator_allocated_bytes", "heap_profile_live_bytes", "rss_bytes"),
    "nmt": ("jvm_nmt_committed_bytes", "rss_bytes"),
}
SUSPECT_KINDS = ("class", "type", "container", "site")
REFERENCE_CONFIDENCE = 0.9  # a reference only needs to grow, not to pass as a suspect
OWNER_CONFIDENCE = 0.9  # an application class carrying a suspect payload only needs to grow with it
CARRIER_TOLERANCE = 0.15  # how close to a whole multiple of an owner's object rate a carrier's must be
NATIVE_CORRELATION = 0.8  # a class follows the native growth when its count floor correlates this well
NATIVE_OWNERS = (  # JDK classes that hold native memory until closed or collected
    "java.util.zip.Deflater",
    "java.util.zip.Inflater",
    "java.util.zip.ZipFile",
    "java.nio.DirectByteBuffer",
    "java.nio.DirectByteBufferR",
    "sun.nio.ch.",
    "sun.nio.fs.",
    "java.io.FileDescriptor",
    "java.net.Socket",
)
REFERENCE_MACHINERY = ("jdk.internal.ref.", "java.lang.ref.")  # cleaners that come with every owner


@dataclass(frozen=True, slots=True)
class Suspect:
    name: str
    kind: str  # class | type | container | site | nmt
    source: str  # jvm | python | containers | jemalloc | gperftools | tracemalloc | nmt
    bytes_per_second: float
    count_per_second: float
    confidence: float  # the lower of the bytes and count trend confidences
    share: float | None  # of the process growth explained, 0..1 (None: the process does not grow)
    share_of: str | None  # the series that growth was measured on
    bytes: float  # at the last snapshot
    count: float
    points: int
    span_seconds: float
    detail: str | None = None
    carried: tuple[str, ...] = ()  # platform classes/builtins growing in step with it (its payload)
    correlation: float | None = None  # of its count floor with the native (RSS) floor, when judged so
    # what holds it, where the process can say: records with `where` and `what` (a JVM's static field
    # from JFR's samples; a Python container named where it lives, with `added_at`, the line adding to it)
    held_by: tuple[dict[str, Any], ...] = ()
    added_at: str | None = None  # a container's: the line that adds to it (`file:line`)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "source": self.source,
            "bytes_per_second": self.bytes_per_second,
            "bytes_per_hour": self.bytes_per_second * 3600,
            "count_per_second": self.count_per_second,
            "confidence": round(self.confidence, 6),
            "share": None if self.share is None else round(self.share, 4),
            "share_of": self.share_of,
            "bytes": self.bytes,
            "count": self.count,
            "points": self.points,
            "span_seconds": self.span_seconds,
            "detail": self.detail,
            "carried": list(self.carried),
            "correlation": None if self.correlation is None else round(self.correlation, 4),
            "held_by": list(self.held_by),
            "added_at": self.added_at,
        }


def current_lifetime(snapshots: list[Snapshot]) -> list[Snapshot]:
    """The snapshots of the process that took the last one (a restart resets every series), and of its
    tracing session (a new session counts from zero again), less the partial ones (a walk its budget
    cut short counts only part of what is there: a false drop)."""
    snapshots = [s for s in snapshots if not s.meta.get("partial")]
    if not snapshots:
        return []
    last = snapshots[-1]
    session = last.meta.get("started_at")
    same = [
        s
        for s in snapshots
        if s.source == last.source
        and (
            last.pid is None or (s.pid == last.pid and abs((s.start_time or 0) - (last.start_time or 0)) < 1)
        )
        and (session is None or s.meta.get("started_at") == session)
    ]
    return same


def rank(
    snapshots: list[Snapshot],
    min_points: int = MIN_POINTS,
    min_confidence: float = MIN_CONFIDENCE,
    native: Points | None = None,
) -> list[Suspect]:
    """Suspects of one histogram series (one kind, one process), largest sustained byte growth first;
    with `native` (the RSS floor as (ts, bytes)), classes whose counts follow it first."""
    snapshots = floor_snapshots(current_lifetime(snapshots), min_points)
    if len(snapshots) < min_points:
        return []
    last = snapshots[-1]
    series: dict[str, list[tuple[float, float, float]]] = {}
    for snapshot in snapshots:
        for row in snapshot.rows:
            series.setdefault(row.name, []).append((snapshot.ts, row.count, row.bytes))
    details = {row.name: row.detail for row in last.rows}
    floors = last.source == "jvm" and last.meta.get("variant") != "live"
    candidates = {
        name: points for name, points in series.items() if len(points) >= min_points and name in details
    }
    required = min_confidence if floors else compared_confidence(min_confidence, len(candidates))
    found, near = [], []
    for name, points in candidates.items():
        if floors:
            points = floor_points(points)
        xs = [p[0] for p in points]
        by_bytes = growth(xs, [p[2] for p in points])
        counts = [p[1] for p in points]
        by_count = growth(xs, counts) if any(counts) else by_bytes  # NMT categories have no counts
        confidence = min(by_bytes.confidence, by_count.confidence)
        passes = confidence >= required and by_bytes.sustained and by_count.sustained
        if not passes and (confidence < OWNER_CONFIDENCE or by_count.slope <= 0):
            continue
        suspect = Suspect(
            name,
            last.kind,
            last.source,
            by_bytes.slope,
            by_count.slope if any(counts) else 0.0,
            confidence,
            None,
            None,
            points[-1][2],
            points[-1][1],
            len(points),
            xs[-1] - xs[0],
            details[name],
            correlation=None if native is None else correlation(counts, at_times(native, xs)),
        )
        if passes:
            found.append(suspect)
        elif not is_platform(suspect):
            near.append(suspect)
    if native is not None:
        found = absorb_machinery(found)
    if last.kind in ("class", "type"):
        found = absorb_carriers(found, near)
    if native is not None:
        found.sort(key=native_order)
    else:
        found.sort(key=lambda s: (-s.bytes_per_second * s.confidence, s.name))
    return found


def compared_confidence(min_confidence: float, compared: int) -> float:
    """The confidence each of `compared` names must reach so that the chance of any of them passing by
    chance stays `1 - min_confidence`. Four snapshots of an in-flight table that fills and empties
    rise in a row one time in 24, and a trend test on four points cannot tell that from a leak; with
    fifty allocation sites compared, one such table is named by chance at many judgements. Post-GC
    floors are exempt (a floor only falls when garbage is collected, so it is not noise of this kind)."""
    return max(min_confidence, 1 - (1 - min_confidence) / max(compared, 1))


def floor_snapshots(snapshots: list[Snapshot], min_points: int) -> list[Snapshot]:
    """The live JVM histograms of a lifetime when there are enough of them (each is a floor already)."""
    live = [s for s in snapshots if s.source == "jvm" and s.meta.get("variant") == "live"]
    if len(live) >= min_points:
        return live
    return [s for s in snapshots if s.meta.get("variant") != "live"] if live else snapshots


def floor_points(points: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """Each (ts, count, bytes) lowered to the minimum of itself and every later snapshot: what survived
    all the collections since, not the garbage of the moment. A class that accumulates keeps its own
    values; request garbage (and the slow ramp that GC aliasing draws through `-all` snapshots) keeps
    the floor it falls back to, and the robust slope of that is flat."""
    out: list[tuple[float, float, float]] = []
    low_count = low_bytes = math.inf
    for ts, count, size in reversed(points):
        low_count, low_bytes = min(low_count, count), min(low_bytes, size)
        out.append((ts, low_count, low_bytes))
    return out[::-1]


def at_times(points: Points, times: list[float]) -> list[float]:
    """The value of `points` (sorted by time) in effect at each of `times` (the first one before them)."""
    out, i = [], 0
    for t in times:
        while i + 1 < len(points) and points[i + 1][0] <= t:
            i += 1
        out.append(points[i][1] if points else 0.0)
    return out


def correlation(xs: list[float], ys: list[float]) -> float:
    """Pearson's correlation of two series of equal length (0 when either is flat)."""
    n = len(xs)
    if n < 2 or len(ys) != n:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


def owns_native(suspect: Suspect) -> bool:
    return suspect.name.startswith(NATIVE_OWNERS)


def native_order(suspect: Suspect) -> tuple[bool, bool, float, float, str]:
    """Classes whose counts follow the native bytes first, JDK owners of native memory first among
    those, then by how closely and how fast they follow."""
    r = suspect.correlation or 0.0
    return (
        r < NATIVE_CORRELATION,
        not owns_native(suspect),
        -round(r, 1),
        -suspect.count_per_second * suspect.confidence,
        suspect.name,
    )


def absorb_machinery(found: list[Suspect]) -> list[Suspect]:
    """Fold what every native owner drags along into it: its nested classes (`Deflater$DeflaterZStreamRef`
    into `Deflater`) and the reference machinery that cleans it up (`CleanerImpl$PhantomCleanableRef`),
    when their counts grow at a whole multiple of the owner's."""
    names = {s.name for s in found}
    owners = [s for s in found if s.count_per_second > 0 and not _machinery(s, names)]
    if not owners:
        return found
    absorbed: dict[str, list[Suspect]] = {s.name: [] for s in owners}
    kept = []
    for suspect in found:
        outer = suspect.name.split("$", 1)[0]
        owner = None
        if outer != suspect.name and outer in absorbed:
            owner = next(s for s in owners if s.name == outer)
        elif _machinery(suspect, names):
            candidates = sorted(owners, key=native_order)
            owner = _owner(suspect, candidates[:1]) if candidates else None
        if owner is None or owner.name == suspect.name:
            kept.append(suspect)
        else:
            absorbed[owner.name].append(suspect)
    return _with_carried(kept, absorbed)


def _with_carried(kept: list[Suspect], absorbed: dict[str, list[Suspect]]) -> list[Suspect]:
    """Each kept suspect with the growth of the suspects folded into it added to its own."""
    out = []
    for suspect in kept:
        carried = absorbed.get(suspect.name) or []
        if carried:
            suspect = replace(
                suspect,
                bytes_per_second=suspect.bytes_per_second + sum(c.bytes_per_second for c in carried),
                bytes=suspect.bytes + sum(c.bytes for c in carried),
                carried=suspect.carried + tuple(c.name for c in carried),
            )
        out.append(suspect)
    return out


def _machinery(suspect: Suspect, names: set[str]) -> bool:
    outer = suspect.name.split("$", 1)[0]
    return suspect.name.startswith(REFERENCE_MACHINERY) or (outer != suspect.name and outer in names)


def is_platform(suspect: Suspect) -> bool:
    """JDK classes and arrays (`[B`, `java.util.HashMap$Node`), Python builtins (`dict`): the containers and
    payloads that application objects hold, rarely the culprit themselves."""
    if suspect.kind == "type":
        return "." not in suspect.name
    module = suspect.detail or ""
    return suspect.name.startswith(("[", "java.", "jdk.", "sun.", "com.sun.")) or module.startswith(
        ("java.", "jdk.")
    )


def absorb_carriers(found: list[Suspect], near: Sequence[Suspect] = ()) -> list[Suspect]:
    """Fold each platform suspect whose object count grows at a small whole multiple (1–8×) of an
    application suspect's into that suspect: a leaked `Record` drags its `byte[]` payload and its
    `HashMap$Node` along, and the record is what on-call must look for.

    A platform suspect no application suspect owns may be owned by a `near` one: an application class
    growing confidently (`OWNER_CONFIDENCE`) but not passing on its own. An exact count stalls with its
    process (a JVM starved of CPU adds nothing between two snapshots, and ties weaken every test),
    while the payload's count, garbage included, keeps moving; the carrier's sustained growth is the
    evidence, and the class it is carried by is named."""
    owners = [s for s in found if not is_platform(s) and s.count_per_second > 0]
    absorbed: dict[str, list[Suspect]] = {s.name: [] for s in owners}
    promoted: list[Suspect] = []
    kept = []
    for suspect in found:
        carrier = is_platform(suspect) and not owns_native(suspect)  # a Deflater is never just a payload
        owner = None
        if carrier:
            owner = _owner(suspect, owners) or _owner(suspect, promoted) or _owner(suspect, near)
        if owner is None:
            kept.append(suspect)
            continue
        if owner.name not in absorbed:
            promoted.append(owner)
            absorbed[owner.name] = []
        absorbed[owner.name].append(suspect)
    return _with_carried(promoted + kept, absorbed)


def _owner(suspect: Suspect, owners: Sequence[Suspect]) -> Suspect | None:
    best, best_error = None, CARRIER_TOLERANCE
    for owner in owners:
        ratio = suspect.count_per_second / owner.count_per_second
        multiple = round(ratio)
        if 1 <= multiple <= 8:
            error = abs(ratio - multiple) / multiple
            if error <= best_error:
                best, best_error = owner, error
    return best


def histogram_growth(snapshots: list[Snapshot]) -> float:
    """Slope of a series' total bytes (the fallback denominator of shares)."""
    snapshots = current_lifetime(snapshots)
    if len(snapshots) < 2:
        return 0.0
    return theil_sen([s.ts for s in snapshots], [s.total_bytes for s in snapshots])


def process_growth(
    store: Store, instance: str, kind: str, since: float, now: float
) -> tuple[float, str] | None:
    """Slope (bytes/s) of the first growing reference series of `kind`, on its lower envelope."""
    for metric in REFERENCES.get(kind, ("rss_bytes",)):
        points = store.series(instance, metric, since, now, agg="min", max_points=60, now=now).points
        if len(points) < MIN_POINTS:
            continue
        fitted = growth([p[0] for p in points], [p[1] for p in points])
        if fitted.slope > 0 and fitted.confidence >= REFERENCE_CONFIDENCE:
            return fitted.slope, metric
    return None


def with_shares(suspects: list[Suspect], reference: tuple[float, str] | None, total: float) -> list[Suspect]:
    """Each suspect's share of the reference growth; without a growing reference, of the histogram's
    total growth, or (when garbage hides that) of the suspects' growth together."""
    if reference is not None:
        slope, name = reference
    elif total > 0:
        slope, name = total, "histogram_total"
    else:
        slope, name = sum(s.bytes_per_second for s in suspects), "suspects_total"
    if slope <= 0:
        return suspects
    return [replace(s, share=min(1.0, s.bytes_per_second / slope), share_of=name) for s in suspects]


def describe(suspect: Suspect) -> str:
    """One line for people: `Leak$Record (class) +12.0 MiB/h, 95 % of the growth`."""
    share = "" if suspect.share is None else f", {100 * suspect.share:.0f} % of the growth"
    rate = format_bytes(suspect.bytes_per_second * 3600)
    follows = (
        "" if suspect.correlation is None else f", count follows native memory (r={suspect.correlation:.2f})"
    )
    return f"{suspect.name} ({suspect.kind}) +{rate}/h{share}{follows}"
