"""The Python type histogram: counts and shallow sizes of live objects per type.

`gc.get_objects()` lists only objects the collector tracks (containers and class instances); atomic
objects such as `str`, `bytes` and `int` are never tracked, so a cache of `str -> bytes` would show as
one `dict` of a few MiB while it holds GiBs; worse, a dict holding only such objects is not tracked
either. Two ways in: `referents=True` adds the untracked objects that any tracked one points to (a
pass over every object's referents: costly), and, cheaply and always, the keys and values of the
`contents` largest dicts and the items of the `contents` longest lists are counted (up to
`MAX_CONTENT_ITEMS` items in all, within the walk's time budget: `contents_complete` is false when
that budget cut the count short, a figure not to compare with the others), so the cache's `bytes` and `str` show at their real size and the
container itself is listed under `containers`. A list's untracked items that are dicts or tuples (a
history of records made of numbers and strings, the usual Python list leak) are counted with their
own untracked contents. The largest dicts are looked for among tracked dicts and the dicts they hold
as values (module globals, instance and class attributes): an untracked dict reachable only through
a tuple or a `__slots__` attribute is missed.

The hook's own objects (types of `medic_hook`, its ctypes handles, its server's sockets and thread)
are left out, so medic never shows among the host's types. Walking holds the GIL, so the host's
threads slow down meanwhile: the walk refuses heaps larger than `max_objects` before it starts
(estimated from `sys.getallocatedblocks()`, or from RSS when pymalloc is off) and stops at `budget_s`.
"""

from __future__ import annotations

import heapq
import sys
import time
from collections import OrderedDict, defaultdict
from typing import Any

from medic_hook.allocator import rss_bytes
from medic_hook.errors import RequestError

_CHECK_EVERY = 4096
_MIN_BYTES_PER_OBJECT = 16
DEFAULT_CONTENTS = 8  # largest dicts whose keys and values are counted
MAX_CONTENT_ITEMS = 1_000_000  # items counted in them, in all
_DICT_TYPES = frozenset((dict, OrderedDict, defaultdict))
_RECORD_TYPES = frozenset((dict, OrderedDict, defaultdict, tuple))  # untracked when holding atomics only
_OWN_MODULES = ("socket", "selectors", "threading", "_thread", "ctypes", "_ctypes", "_socket")
_MAX_OWN = 2000


def estimate_objects() -> tuple[int, str]:
    """A cheap upper-bound-ish estimate of the number of live objects, and how it was made."""
    blocks = sys.getallocatedblocks()
    if blocks:
        return blocks, "pymalloc allocated blocks"
    return rss_bytes() // _MIN_BYTES_PER_OBJECT, "RSS / 16 bytes (pymalloc is off)"


def _type_name(kind: type) -> str:
    module = _module_of(kind)
    qualname = getattr(kind, "__qualname__", kind.__name__)
    return qualname if module in ("", "builtins") else f"{module}.{qualname}"


def _size(obj: Any) -> int:
    try:
        return sys.getsizeof(obj)
    except Exception:  # a broken __sizeof__ in the host's code must not break the walk
        return 0


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
    max_objects: int = 2_000_000,
    budget_s: float = 1.0,
    referents: bool = False,
    contents: int = DEFAULT_CONTENTS,
) -> dict[str, Any]:
    """Counts and shallow sizes per type, the `top` largest by count; raises `RequestError`
    (`too_expensive`) when the heap is too large or the walk overran its budget."""
    import gc

    estimate, how = estimate_objects()
    if estimate > max_objects:
        raise RequestError(
            "too_expensive",
            f"heap too large to walk: about {estimate} objects ({how}) > max_objects {max_objects}; "
            "raise max_objects (the walk holds the GIL) or use heap profiles instead",
        )
    started = time.perf_counter()
    deadline = started + budget_s
    counts: dict[type, list[int]] = {}
    seen_untracked: set[int] = set()
    largest: list[tuple[int, int, Any]] = []  # a min-heap of the `contents` longest dicts
    longest: list[tuple[int, int, Any]] = []  # ... and lists
    walked = 0
    objects = gc.get_objects()
    try:
        for obj in objects:
            walked += 1
            if walked % _CHECK_EVERY == 0 and time.perf_counter() > deadline:
                raise RequestError(
                    "too_expensive",
                    f"histogram walk exceeded its budget of {budget_s}s after {walked} of {len(objects)} "
                    "objects; raise budget_s (at most 10) or use heap profiles instead",
                )
            kind = type(obj)
            row = counts.setdefault(kind, [0, 0])
            row[0] += 1
            row[1] += _size(obj)
            if kind in _DICT_TYPES and contents:
                _keep_largest(largest, contents, obj)
                try:
                    for value in obj.values():  # a dict of only atomic items is untracked: found here
                        if type(value) in _DICT_TYPES and not gc.is_tracked(value):
                            _keep_largest(largest, contents, value)
                except RuntimeError:  # resized by another thread meanwhile
                    pass
            elif kind is list and contents:
                _keep_largest(longest, contents, obj)
            if referents:
                for ref in gc.get_referents(obj):
                    if not gc.is_tracked(ref) and id(ref) not in seen_untracked:
                        seen_untracked.add(id(ref))
                        ref_row = counts.setdefault(type(ref), [0, 0])
                        ref_row[0] += 1
                        ref_row[1] += _size(ref)
    finally:
        del objects  # drop the references to every object before returning
    held = [entry[2] for entry in sorted(largest, reverse=True)]
    held += [entry[2] for entry in sorted(longest, reverse=True)]
    del largest, longest
    containers, counted, cut = _count_contents(held, counts, seen_untracked if referents else None, deadline)
    del held
    hidden = _leave_out_own(counts)
    rows = sorted(counts.items(), key=lambda item: (-item[1][0], -item[1][1]))
    return {
        "objects": walked + len(seen_untracked) + counted - hidden,
        "tracked_objects": walked - hidden,
        "distinct_types": len(rows),
        "types": [{"type": _type_name(kind), "count": c, "bytes": b} for kind, (c, b) in rows[:top]],
        "containers": containers,
        "contents_complete": not cut,  # False: the time budget cut the count short, a partial figure
        "hook_objects": hidden,
        "elapsed_s": round(time.perf_counter() - started, 6),
        "referents": referents,
    }


def _keep_largest(largest: list[tuple[int, int, Any]], keep: int, mapping: Any) -> None:
    """Keep `mapping` in the min-heap `largest` if it is among the `keep` longest (ties by id, which
    is unique among live objects: dicts themselves are never compared)."""
    length = len(mapping)
    if len(largest) >= keep and length <= largest[0][0]:
        return
    if any(entry[2] is mapping for entry in largest):
        return
    if len(largest) < keep:
        heapq.heappush(largest, (length, id(mapping), mapping))
    else:
        heapq.heapreplace(largest, (length, id(mapping), mapping))


def _count_contents(
    held: list[Any], counts: dict[type, list[int]], seen: set[int] | None, deadline: float
) -> tuple[list[dict[str, Any]], int, bool]:
    """Count the untracked keys and values of the dicts in `held`, and the untracked items of its lists
    (with their contents when they are records), into `counts`; one summary per container, and how many
    objects were added, and whether the time budget cut the count short. A container another thread
    resizes meanwhile is counted as far as it got."""
    import gc

    containers, added, budget, cut = [], 0, MAX_CONTENT_ITEMS, False

    def count(item: Any) -> int:
        """Count one untracked object; its bytes (0 when tracked or already counted)."""
        nonlocal added
        if item is None or item is True or item is False or gc.is_tracked(item):
            return 0  # a singleton held a million times is still one object
        if seen is not None and id(item) in seen:
            return 0
        size = _size(item)
        row = counts.setdefault(type(item), [0, 0])
        row[0] += 1
        row[1] += size
        added += 1
        return size

    for container in held:
        if budget <= 0:
            break
        if time.perf_counter() > deadline:
            cut = True
            break
        is_list = type(container) is list
        content_bytes, entries, complete = 0, 0, True
        kinds: dict[tuple[str, ...], int] = {}
        try:
            for entry in container if is_list else container.items():
                entries += 1
                if entries > budget:
                    complete = False  # counted as far as the walk's item budget allows
                    break
                if entries % _CHECK_EVERY == 0 and time.perf_counter() > deadline:
                    complete, cut = False, True  # ... and its time budget
                    break
                if is_list:
                    content_bytes += count(entry)
                    if type(entry) in _RECORD_TYPES and not gc.is_tracked(entry):
                        for part in entry.values() if type(entry) is not tuple else entry:
                            content_bytes += count(part)
                    kind: tuple[str, ...] = (_type_name(type(entry)),)
                else:
                    key, value = entry
                    content_bytes += count(key) + count(value)
                    kind = (_type_name(type(key)), _type_name(type(value)))
                if len(kinds) < 16 or kind in kinds:
                    kinds[kind] = kinds.get(kind, 0) + 1
        except RuntimeError:  # resized by another thread while we counted
            complete = False
        budget -= entries
        common = max(kinds.items(), key=lambda item: item[1])[0] if kinds else None
        containers.append(
            {
                "type": _type_name(type(container)),
                "len": len(container),
                "bytes": _size(container),
                "content_bytes": content_bytes,
                "holds": " -> ".join(common) if common else None,
                "complete": complete,
            }
        )
    return containers, added, cut


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
            row[1] = max(0, row[1] - _size(obj))
            hidden += 1
    for kind in [k for k, (c, _) in counts.items() if c <= 0]:
        del counts[kind]
    return hidden
