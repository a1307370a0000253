"""What a container holds, counted into the type counts without making an object per item.

`count_contents` counts the items of a container that the collector does not track (atomics, and
untracked dicts and tuples with their own contents, the records of a history list): all of them up to
`SAMPLE_ITEMS`, else every `step`-th item from a varying offset (a prime step, so that no period of
the container's layout lines up with it), scaled to the container's length. Items are grouped by type
and measured per group in C (`measure`): a tracing session would trace every int a Python loop makes,
and makes each allocation some 30 times dearer, hence also a smaller sample while one runs.
"""

from __future__ import annotations

import gc
import sys
import time
import types
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from medic_hook.containers import MAPPINGS, base_of, length

RECORD_TYPES = frozenset((dict, OrderedDict, defaultdict, tuple))  # untracked when holding atomics only
SAMPLE_ITEMS = 10_000  # items of one container counted one by one; past this, a sample
SAMPLE_ITEMS_TRACING = 2_000  # ... while tracemalloc traces (and makes every allocation ~30x dearer)
_SHAPES = 256  # first entries of a container whose types say what it holds
_CHECK_EVERY = 1024


def _prime_at_least(n: int) -> int:
    n = max(n, 2)
    while any(n % d == 0 for d in range(2, int(n**0.5) + 1)):
        n += 1
    return n


def sample_step(total: int, wanted: int) -> int:
    """1 when `total` items can all be counted; else a prime step of at least 7 that keeps about
    `wanted` of them (a small step would line up with a container's period: pairs, triples)."""
    if total <= wanted:
        return 1
    return _prime_at_least(max(7, -(-total // max(1, wanted))))


def type_name(kind: type) -> str:
    module = getattr(kind, "__module__", None)
    module = module if isinstance(module, str) else ""
    qualname = getattr(kind, "__qualname__", kind.__name__)
    return qualname if module in ("", "builtins") else f"{module}.{qualname}"


def size_of(obj: Any) -> int:
    try:
        return sys.getsizeof(obj)
    except Exception:  # a broken __sizeof__ in the host's code must not break the walk
        return 0


_C_METHODS = (types.MethodDescriptorType, types.WrapperDescriptorType)


def measure(objects: list[Any]) -> tuple[int, int]:
    """How many `objects` (all of one type) and their shallow bytes as `sys.getsizeof` says, summed in
    C: the type's own C `__sizeof__` is called unbound (`getsizeof` makes a bound method per object,
    which a tracing session would trace), plus the headers `getsizeof` adds (the same for every
    object of a type: the collector's, a managed dict's), read once from the first."""
    if not objects:
        return 0, 0
    kind = type(objects[0])
    sizeof = getattr(kind, "__sizeof__", None)
    try:
        if sizeof is not None and type(sizeof) in _C_METHODS and not issubclass(kind, type):
            header = sys.getsizeof(objects[0]) - sizeof(objects[0])
            return len(objects), sum(map(sizeof, objects)) + header * len(objects)
        return len(objects), sum(map(sys.getsizeof, objects))
    except Exception:  # a broken __sizeof__ in the host's code: measured one by one, without it
        return len(objects), sum(size_of(obj) for obj in objects)


def count_contents(
    container: Any, name: str | None, counts: dict[type, list[int]], over: Callable[[], bool]
) -> tuple[dict[str, Any], int, bool]:
    """Count what `container` holds and the tracker does not (atomics, untracked dicts and tuples with
    their own contents) into `counts`; its summary, how many objects were added, and whether `over()`
    cut the count short. A container another thread resizes meanwhile is counted as far as it got.
    What it holds is grouped by type and measured per group (`measure`): counting makes almost no
    objects of its own, which a tracing session would trace one by one."""
    kind = type(container)
    base = base_of(kind) or list
    total = length(container, base)
    step = sample_step(total, SAMPLE_ITEMS_TRACING if _tracing() else SAMPLE_ITEMS)
    offset = time.perf_counter_ns() % step
    mapping = base is dict
    complete, cut, entries = True, False, 0
    found: dict[type, list[Any]] = {}  # what the entries counted hold, by type, before scaling
    is_tracked = gc.is_tracked

    def count(item: Any) -> None:
        if item is None or item is True or item is False or is_tracked(item):
            return  # tracked objects are the walk's; a singleton held a million times is one object
        bucket = found.get(type(item))
        if bucket is None:
            bucket = found[type(item)] = []
        bucket.append(item)

    try:
        if mapping:  # keys and values side by side: no (key, value) pair made per entry
            keys = _sampled(dict.keys(container), step, offset)
            values = _sampled(dict.values(container), step, offset)
        else:
            keys, values = _sampled(base.__iter__(container), step, offset), iter(())
        while True:
            chunk = list(islice(keys, _CHECK_EVERY))
            if not chunk:
                break
            entries += len(chunk)
            for item in chunk:
                count(item)
                if not mapping and type(item) in RECORD_TYPES and not is_tracked(item):
                    for part in item.values() if type(item) is not tuple else item:
                        count(part)
            for item in islice(values, len(chunk)):
                count(item)
            if over():
                complete, cut = False, True
                break
    except RuntimeError:  # resized by another thread while we counted
        complete = False
    scale = total / entries if step > 1 and entries and complete else 1.0  # a sample: to the whole
    added = content_bytes = 0
    for item_kind, items in found.items():
        item_count, item_bytes = measure(items)
        row = counts.setdefault(item_kind, [0, 0])
        row[0] += round(item_count * scale)
        row[1] += round(item_bytes * scale)
        added += round(item_count * scale)
        content_bytes += item_bytes
    found.clear()
    ranked = _shapes(container, base)
    summary = {
        "name": name,
        "type": type_name(kind),
        "len": total,
        "bytes": size_of(container) if base is kind or kind in MAPPINGS else base.__sizeof__(container),
        "content_bytes": round(content_bytes * scale),
        "holds": ranked[0] if ranked else None,
        "kinds": ranked[:4],
        "complete": complete,
        "sampled": step,
    }
    return summary, added, cut


def _tracing() -> bool:
    tracemalloc = sys.modules.get("tracemalloc")
    return tracemalloc is not None and tracemalloc.is_tracing()


def _sampled(iterator: Iterable[Any], step: int, offset: int) -> Iterator[Any]:
    return iter(iterator) if step == 1 else islice(iterator, offset, None, step)


def _shapes(container: Any, base: Any) -> list[str]:
    """What the first entries of a container are, most frequent first: `int -> bytes`, `str`."""
    kinds: dict[tuple[type, ...], int] = {}
    try:
        entries = islice(dict.items(container) if base is dict else base.__iter__(container), _SHAPES)
        for entry in entries:
            shape = (type(entry[0]), type(entry[1])) if base is dict else (type(entry),)
            kinds[shape] = kinds.get(shape, 0) + 1
    except RuntimeError:  # resized by another thread meanwhile
        pass
    ranked = sorted(kinds.items(), key=lambda item: -item[1])
    return [" -> ".join(type_name(kind) for kind in shape) for shape, _ in ranked]
