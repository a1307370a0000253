"""The Python type histogram: counts and shallow sizes of live objects per type, within a time budget
on a heap of any size.

`gc.get_objects()` lists only objects the collector tracks (containers and class instances); atomic
objects such as `str`, `bytes` and `int` are never tracked, and a dict holding only such objects is
not tracked either. So, besides the tracked objects, the walk counts what the longest containers hold
(`medic_hook.containers`): the `2 × contents` longest containers that the application's module
globals reach by name (`cache_service.cache`, `app.BUS._subscribers`; the standard library's
modules get `contents / 2` of their own), and the `contents` longest dicts and lists the walk
meets (tracked ones, the untracked dicts that tracked dicts hold as values, and the containers held
as attributes of the instances walked, named `module.Class().attr`). Each is listed under
`containers` with its length, content types and bytes, and what it holds is counted into the types
(`medic_hook.contents`: one by one up to 10,000 items, else a scaled sample): an unbounded `dict` of
`int -> bytes` shows as its `bytes` at their real size. `referents=True` adds every untracked object
any walked one points to.

**Cost.** Walking holds the GIL (the host's other threads get it back every switch interval), so the
walk has a budget: `budget_s` seconds of the walking thread's CPU time, and `wall_s` of wall time
(what medic's client waits for; by default `budget_s + 1`, at least twice `budget_s`). A heap of up
to 50,000 tracked objects is walked in one pass. A larger one is walked in passes: with a prime stride `q` (at least 7, so that no period of the heap's layout
lines up with it) each pass takes every `q`-th object from a different offset, and passes go on while
the next one fits within 70 % of the budget, or until all `q` are done (a whole walk). Counts and bytes
are scaled by `q / passes`. The next walk starts at the offset where this one stopped (an index,
no reference kept), so successive walks cover the heap. Only the list that `gc.get_objects()` makes
is proportional to the heap (8 bytes per tracked object, freed before the reply); a first pass that
cannot end within the CPU budget is refused as `too_expensive` (the wall time stops only the passes
after it: an answer late on a busy host is better than none). A count of the contents that the budget
cut short makes `contents_complete` false: a partial figure, not to compare with the others (the
containers the walk met are counted whole or not at all, the shortest left out first).

The hook's own objects (types of `medic_hook`, its ctypes handles, its server's sockets and thread)
are left out, so medic never shows among the host's types.
"""

from __future__ import annotations

import sys
import time
from itertools import islice
from typing import Any

from medic_hook.containers import (
    MAPPINGS,
    NAMED_MIN_LEN,
    SEQUENCES,
    Longest,
    is_instance_type,
    offer_attributes,
    scan_roots,
)
from medic_hook.contents import count_contents, measure, sample_step, size_of, type_name
from medic_hook.errors import RequestError

_CHECK_EVERY = 1024
DEFAULT_CONTENTS = 8  # longest containers of each kind whose contents are counted
PASS_OBJECTS = 50_000  # objects walked per pass of a sampled walk
MAX_OBJECTS = 100_000_000  # the most a request may ask to walk (`max_objects`)
WALK_SHARE = 0.7  # passes start only while they fit within this share of the budget
ROOTS_SHARE = 0.5  # the scan of module globals and the count of what they hold stop here
_VALUES_SCANNED = 100_000  # values of one tracked dict looked at for untracked dicts
_VALUES_FROM = 16  # ... in dicts of at least this many entries
_EVERY_INSTANCE = 64  # a pass looks into the attributes of a class's first 64 instances, then every 64th
_EVERY_INSTANCE_MASK = _EVERY_INSTANCE - 1
_OWN_MODULES = ("socket", "selectors", "threading", "_thread", "ctypes", "_ctypes", "_socket")
_MAX_OWN = 2000
_NONE, _MAPPING, _SEQUENCE, _INSTANCE = 0, 1, 2, 3
_rotation = 0  # the offset the next sampled walk starts at


class Budget:
    """The walking thread's CPU time within `seconds` (what the host's other threads wait for), and
    wall time within `wall_seconds` (what medic's client waits for: on a busy host the walk gets only
    part of a CPU)."""

    def __init__(self, seconds: float, wall_seconds: float | None = None) -> None:
        self.seconds = seconds
        self.wall_seconds = wall_seconds if wall_seconds is not None else wall_allowance(seconds)
        self.cpu_started = time.thread_time()
        self.wall_started = time.perf_counter()

    def cpu(self) -> float:
        return time.thread_time() - self.cpu_started

    def wall(self) -> float:
        return time.perf_counter() - self.wall_started

    def over(self, share: float = 1.0, wall: bool = True) -> bool:
        """Whether `share` of the CPU budget is used, or (with `wall`) `share` of the wall time."""
        return self.cpu() > share * self.seconds or (wall and self.wall() > share * self.wall_seconds)


def wall_allowance(seconds: float) -> float:
    """The wall time a walk of `seconds` of CPU may take when the client did not say (`wall_s`): one
    second short of the `seconds + 2` that medic's clients before `wall_s` wait, and at least twice
    the CPU budget."""
    return max(seconds + 1.0, 2 * seconds)


def _module_of(kind: type) -> str:
    module = getattr(kind, "__module__", None)  # a descriptor on some classes of C extensions
    return module if isinstance(module, str) else ""


def _is_medic(kind: type) -> bool:
    module = _module_of(kind)
    return module == "medic_hook" or module.startswith("medic_hook.")


def own_objects() -> list[Any]:
    """The long-lived objects the hook holds in its host: its ctypes handles (libraries, their
    function-pointer classes and functions) and what its server reaches (sockets, selector, thread),
    found by a bounded walk that follows only objects of those modules and their attribute containers."""
    import gc

    from medic_hook import dl

    roots: list[Any] = []
    for lib in (dl.process_symbols(), dl.libc()):
        if lib is not None:
            functions = [v for v in vars(lib).values() if isinstance(v, lib._FuncPtr)]
            roots += [lib, vars(lib), lib._FuncPtr, *functions]
            roots += [f.argtypes for f in functions if f.argtypes is not None]
    server = getattr(sys.modules.get("medic_hook"), "_server", None)
    found: dict[int, Any] = {id(o): o for o in roots}
    queue = [o for o in (server, getattr(server, "_thread", None)) if o is not None]
    found.update((id(o), o) for o in queue)
    while queue and len(found) < _MAX_OWN:
        holder = queue.pop()
        for ref in gc.get_referents(holder):
            if id(ref) not in found and _follow(holder, ref):
                found[id(ref)] = ref
                queue.append(ref)
    return list(found.values())


def _own_kind(kind: type) -> bool:
    return _is_medic(kind) or _module_of(kind) in _OWN_MODULES


def _follow(holder: Any, ref: Any) -> bool:
    """Objects of the hook's modules, and containers only as attributes of such objects (a shared
    dict, a type, a module or a function is never followed)."""
    if isinstance(ref, type) or type(ref).__name__ in ("module", "function", "builtin_function_or_method"):
        return False
    if type(ref) in (dict, list, set, tuple):
        return _own_kind(type(holder))
    return _own_kind(type(ref))


def type_histogram(
    top: int = 50,
    max_objects: int | None = None,
    budget_s: float = 1.0,
    referents: bool = False,
    contents: int = DEFAULT_CONTENTS,
    wall_s: float | None = None,
) -> dict[str, Any]:
    """Counts and shallow sizes per type, the `top` largest by count, from a walk of at most
    `max_objects` tracked objects (default: as many as `budget_s` of CPU allows, within `wall_s` of
    wall time); raises `RequestError` (`too_expensive`) when not even one pass of the walk fits."""
    import gc

    budget = Budget(budget_s, wall_s)
    counts: dict[type, list[int]] = {}  # exact figures: what the containers hold
    named, library = Longest(2 * contents), Longest(contents // 2)
    mappings, sequences = Longest(contents), Longest(contents)
    complete = scan_roots(named, lambda: budget.over(ROOTS_SHARE), library) if contents else True
    roots = named.drain(NAMED_MIN_LEN) + library.drain(NAMED_MIN_LEN)
    by_id, counted, cut = _count_all(roots, counts, budget, ROOTS_SHARE, set())
    del roots
    held, summaries = set(by_id), list(by_id.values())  # counted whole: the walk leaves them out
    del by_id
    objects = gc.get_objects()
    try:
        walk = _walk(objects, budget, max_objects, referents, held, (mappings, sequences), contents > 0)
    finally:
        total = len(objects)
        del objects  # drop the references to every object before anything else
    scale = walk.stride / walk.passes
    for kind, (count, size) in walk.counts.items():
        row = counts.setdefault(kind, [0, 0])
        row[0] += round(count * scale)
        row[1] += round(size * scale)
    found = [entry for entry in (*mappings.drain(), *sequences.drain()) if id(entry[0]) not in held]
    more, added, more_cut = _count_all(found, counts, budget, 1.0, held, walked=True)
    del found, held
    summaries += more.values()
    hidden = _leave_out_own(counts)
    rows = sorted(counts.items(), key=lambda item: (-item[1][0], -item[1][1]))
    return {
        "objects": total + round(walk.untracked * scale) + counted + added - hidden,
        "tracked_objects": total - hidden,
        "walked": walk.walked,
        "sample_fraction": round(walk.passes / walk.stride, 6),
        "distinct_types": len(rows),
        "types": [{"type": type_name(kind), "count": c, "bytes": b} for kind, (c, b) in rows[:top]],
        "containers": summaries,
        "contents_complete": complete and not (cut or more_cut),  # False: a partial figure
        "hook_objects": hidden,
        "elapsed_s": round(budget.wall(), 6),
        "cpu_s": round(budget.cpu(), 6),
        "referents": referents,
    }


def _count_all(
    found: list[tuple[Any, str | None, type | None]],
    counts: dict[type, list[int]],
    budget: Budget,
    share: float,
    skip: set[int],
    walked: bool = False,
) -> tuple[dict[int, dict[str, Any]], int, bool]:
    """Count each container of `found` (by id, the ones in `skip` left out) and what it holds until
    `share` of the budget is used; their summaries by id, the objects added, and whether the budget
    cut the count short (a partial figure). A container is counted itself unless it is tracked and
    was met by the walk (`walked`: its count is the walk's). The walk's containers are counted whole
    or not at all: which of them a sampled walk meets changes from walk to walk anyway, and the budget
    only ever leaves out the shortest (they come longest first)."""
    import gc

    summaries: dict[int, dict[str, Any]] = {}
    added = 0
    for container, name, _owner in found:
        if id(container) in skip:
            continue
        if budget.over(share):
            return summaries, added, not walked
        into: dict[type, list[int]] = {} if walked else counts
        summary, more, cut = count_contents(container, name, into, lambda: budget.over(share))
        if cut and walked:
            return summaries, added, False
        summaries[id(container)] = summary
        added += more
        if not (walked and gc.is_tracked(container)):
            row = into.setdefault(type(container), [0, 0])
            row[0] += 1
            row[1] += summary["bytes"]
            added += not gc.is_tracked(container)
        if into is not counts:
            for kind, (count, size) in into.items():
                row = counts.setdefault(kind, [0, 0])
                row[0] += count
                row[1] += size
        if cut:
            return summaries, added, True
    return summaries, added, False


class _Walk:
    """What the passes over the tracked objects found: per-type counts and bytes (of the passes done),
    untracked referents, and the stride and passes to scale them by."""

    def __init__(self, stride: int) -> None:
        self.stride = stride
        self.passes = 0
        self.walked = 0
        self.untracked = 0
        self.counts: dict[type, list[int]] = {}


def _walk(
    objects: list[Any],
    budget: Budget,
    max_objects: int | None,
    referents: bool,
    held: set[int],
    found: tuple[Longest, Longest],
    contents: bool,
) -> _Walk:
    global _rotation
    total = len(objects)
    per_pass = min(PASS_OBJECTS, max_objects or PASS_OBJECTS)
    stride = sample_step(total, per_pass)
    walk = _Walk(stride)
    limit = stride if max_objects is None else max(1, min(stride, max_objects // max(1, -(-total // stride))))
    start, slowest = _rotation % stride, 0.0
    seen: set[int] = set()
    for turn in range(limit):
        began = budget.cpu()
        if walk.passes and began + slowest > WALK_SHARE * budget.seconds:
            break
        sample = objects if stride == 1 else objects[(start + turn) % stride :: stride]
        # the first pass is what the reply cannot do without: only the CPU budget stops it
        tally, untracked = _one_pass(sample, budget, referents, seen, held, found, contents, walk.passes > 0)
        if tally is None:
            break
        walk.passes += 1
        walk.walked += len(sample)
        walk.untracked += untracked
        for kind, (count, size) in tally.items():
            row = walk.counts.setdefault(kind, [0, 0])
            row[0] += count
            row[1] += size
        slowest = max(slowest, budget.cpu() - began)
    _rotation = (start + walk.passes) % stride
    if not walk.passes:
        raise RequestError(
            "too_expensive",
            f"histogram walk exceeded its budget of {budget.seconds}s before its first pass over {total} "
            f"objects ended; raise budget_s (histograms.python.budget in medic's config, at most 10s for "
            "the hook) or use heap profiles instead",
        )
    return walk


def _role(kind: type) -> int:
    if kind in MAPPINGS:
        return _MAPPING
    if kind in SEQUENCES:
        return _SEQUENCE
    return _INSTANCE if is_instance_type(kind) else _NONE


def _one_pass(
    sample: list[Any],
    budget: Budget,
    referents: bool,
    seen: set[int],
    held: set[int],
    found: tuple[Longest, Longest],
    contents: bool,
    wall: bool = True,
) -> tuple[dict[type, tuple[int, int]] | None, int]:
    """One pass over `sample`: per type (count, bytes), and the untracked referents counted; no tally
    when the budget ran out before its end. The containers in `held` are counted elsewhere. Objects
    are grouped by type and measured per group at the end, so that the pass makes almost no objects
    of its own (a tracing session would trace each one)."""
    import gc

    mappings, sequences = found
    groups: dict[type, list[Any]] = {}  # [role, objects, countdown, first instances left]
    extra: dict[type, tuple[int, list[Any]]] = {}  # untracked referents
    names_of: dict[type, list[str]] = {}
    is_tracked = gc.is_tracked
    for start in range(0, len(sample), _CHECK_EVERY):
        if start and budget.over(wall=wall):
            return None, 0
        for obj in sample[start : start + _CHECK_EVERY]:
            kind = type(obj)
            group = groups.get(kind)
            if group is None:
                group = groups[kind] = [_role(kind) if contents else _NONE, [], 0, _EVERY_INSTANCE]
            role = group[0]
            if role in (_MAPPING, _SEQUENCE):
                size = len(obj)
                if size >= NAMED_MIN_LEN and id(obj) in held:
                    continue
                longest = mappings if role == _MAPPING else sequences
                if size > longest.low:
                    longest.offer(obj, size=size)
                if (
                    role == _MAPPING and size >= _VALUES_FROM
                ):  # smaller: a __dict__, kwargs (owners are walked)
                    _offer_untracked(mappings, obj)
            elif role == _INSTANCE:
                # of a class of many, one instance in 64 (a countdown: len() past 256 makes an int,
                # which a tracing session would trace)
                if group[3]:
                    group[3] -= 1
                    offer_attributes(mappings, sequences, obj, names_of)
                else:
                    group[2] = (group[2] - 1) & _EVERY_INSTANCE_MASK
                    if group[2] == 0:
                        offer_attributes(mappings, sequences, obj, names_of)
            group[1].append(obj)
            if referents:
                for ref in gc.get_referents(obj):
                    if not is_tracked(ref) and id(ref) not in seen:
                        seen.add(id(ref))
                        ref_group = extra.get(type(ref))
                        if ref_group is None:
                            ref_group = extra[type(ref)] = (_NONE, [])
                        ref_group[1].append(ref)
    tally = {kind: measure(group[1]) for kind, group in groups.items()}
    untracked = 0
    for kind, (_, objects) in extra.items():
        count, size = measure(objects)
        before = tally.get(kind, (0, 0))
        tally[kind] = (before[0] + count, before[1] + size)
        untracked += count
    return tally, untracked


def _offer_untracked(mappings: Longest, mapping: dict[Any, Any]) -> None:
    """Offer the untracked dicts `mapping` holds as values: a dict of atomics only is found here."""
    import gc

    try:
        values = (
            mapping.values() if len(mapping) <= _VALUES_SCANNED else islice(mapping.values(), _VALUES_SCANNED)
        )
        for value in values:
            if type(value) in MAPPINGS and len(value) > mappings.low and not gc.is_tracked(value):
                mappings.offer(value, size=len(value))
    except RuntimeError:  # resized by another thread meanwhile
        pass


def _leave_out_own(counts: dict[type, list[int]]) -> int:
    """Remove the hook's own objects from `counts`; how many were removed."""
    import gc

    hidden = 0
    for kind in [k for k in counts if _is_medic(k)]:
        hidden += counts.pop(kind)[0]
    for obj in own_objects():
        row = counts.get(type(obj))
        if row is not None and gc.is_tracked(obj) and row[0] > 0:
            row[0] -= 1
            row[1] = max(0, row[1] - size_of(obj))
            hidden += 1
    for kind in [k for k, (c, _) in counts.items() if c <= 0]:
        del counts[kind]
    return hidden
