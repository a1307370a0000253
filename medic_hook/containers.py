"""The host's longest containers, named by where they live, and what they hold.

`gc.get_objects()` lists only what the collector tracks: a `str`, `bytes`, `int` or `float` never is,
and a dict holding only such objects is not tracked either, so an unbounded `dict` of `int -> bytes`
is invisible to a walk of tracked objects. Containers are therefore looked for from the roots too:
every module's globals, the attributes of the classes and objects they hold, and the containers a
module-level dict holds by name (`Longest`, `scan_roots`). A container found so is named by where it
lives (`cache_service.cache`, `app.BUS._subscribers`, `app.Renderer.cache`); one found as an
attribute of an instance met in the walk is named `module.Class().attr`; others stay unnamed.

Nothing here runs the host's code: a container is measured and iterated through its builtin base
(`dict.__len__`, `dict.items`), never through a subclass's overrides; attributes are read with
`object.__getattribute__` under names that are not descriptors of the class (no property runs, no
`__getattr__`, no instance dict is materialized), a module's globals through the module's own slot.

`count_contents` counts what a container holds into the type counts: all of it up to `SAMPLE_ITEMS`
items, else every `step`-th item from a varying offset (a prime step, so that no period of the
container's layout lines up with it) scaled back up to the container's length.
"""

from __future__ import annotations

import gc
import heapq
import sys
import time
import types
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

MAPPINGS = frozenset((dict, OrderedDict, defaultdict, Counter))
SEQUENCES = frozenset((list, set, frozenset, deque))
_BASES = (dict, list, set, frozenset, deque)
RECORD_TYPES = frozenset((dict, OrderedDict, defaultdict, tuple))  # untracked when holding atomics only
NAMED_MIN_LEN = 64  # a shorter container is not worth a name (nor a row of its own)
SAMPLE_ITEMS = 10_000  # items of one container counted one by one; past this, a sample
SAMPLE_ITEMS_TRACING = 2_000  # ... while tracemalloc traces (and makes every allocation ~30x dearer)
_ATTRIBUTE_NAMES = 256  # names tried as attributes of one class
_SHAPES = 256  # first entries of a container whose types say what it holds
_DICT_KEYS = 256  # keys of a module-level dict looked into for containers
_CHECK_EVERY = 1024
_OWN_PREFIX = "medic_hook"
_SKIPPED = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type)


def base_of(kind: type) -> Any:
    """The builtin container type `kind` is or derives from (its methods are used, never overrides)."""
    if kind in MAPPINGS:
        return dict
    if kind in SEQUENCES:
        return kind
    try:
        return next((b for b in _BASES if issubclass(kind, b)), None)
    except TypeError:
        return None


def length(container: Any, base: Any) -> int:
    try:
        return int(base.__len__(container))
    except Exception:  # a subclass whose layout its base cannot read
        return 0


class Longest:
    """The `keep` longest containers offered (each once), with the first name each was offered under
    and the class whose code fills it when it is an attribute (its `owner`)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.low = -1 if keep > 0 else 2**63  # a container must be longer than this to be kept
        self._heap: list[tuple[int, int, Any]] = []
        self._members: dict[int, tuple[str, type | None] | None] = {}

    def offer(
        self, container: Any, name: str | None = None, size: int | None = None, owner: type | None = None
    ) -> None:
        key = id(container)
        label = None if name is None else (name, owner)
        if key in self._members:
            if label is not None and self._members[key] is None:
                self._members[key] = label
            return
        if size is None:
            base = base_of(type(container))
            size = length(container, base) if base is not None else 0
        if self.keep <= 0 or (len(self._heap) >= self.keep and size <= self._heap[0][0]):
            return
        entry = (size, key, container)
        if len(self._heap) < self.keep:
            heapq.heappush(self._heap, entry)
        else:
            dropped = heapq.heapreplace(self._heap, entry)
            del self._members[dropped[1]]
        self._members[key] = label
        if len(self._heap) >= self.keep:
            self.low = self._heap[0][0]

    def __contains__(self, container: Any) -> bool:
        return id(container) in self._members

    def drain(self, shortest: int = 0) -> list[tuple[Any, str | None, type | None]]:
        """The containers kept of at least `shortest` items, longest first, with their names and
        owners; the references are let go."""
        ranked = sorted(self._heap, key=lambda e: (-e[0], e[1]))
        out = []
        for size, key, container in ranked:
            if size >= shortest:
                name, owner = self._members[key] or (None, None)
                out.append((container, name, owner))
        self._heap.clear()
        self._members.clear()
        self.low = -1 if self.keep > 0 else 2**63
        return out


def module_dict(module: Any) -> dict[str, Any] | None:
    """A module's globals through the module's own slot (a lazy module's `__getattribute__` never runs)."""
    if not issubclass(type(module), types.ModuleType):
        return None
    try:
        found = object.__getattribute__(module, "__dict__")
    except Exception:
        return None
    return found if type(found) is dict else None


_TYPE_SLOTS = {name: type.__dict__[name] for name in ("__dict__", "__mro__", "__flags__", "__qualname__")}


def class_dict(kind: type) -> Any:
    """A class's own namespace through `type`'s slot: a metaclass's `__getattribute__` never runs."""
    return _TYPE_SLOTS["__dict__"].__get__(kind)


def type_slot(kind: type, name: str, default: Any) -> Any:
    try:
        return _TYPE_SLOTS[name].__get__(kind)
    except Exception:
        return default


def attribute_names(kind: type) -> list[str]:
    """Names a class's own code assigns or reads as attributes (its methods' `co_names`, its
    `__slots__`) that are not descriptors of the class: those are safe to read on an instance."""
    names: dict[str, None] = {}
    mro = [c for c in type_slot(kind, "__mro__", ()) if c is not object]
    described: set[str] = set()
    for cls in mro:
        try:
            members = class_dict(cls)
        except Exception:
            continue
        described.update(k for k in members if type(k) is str)
        for value in list(members.values()):
            code = getattr(value, "__code__", None) if type(value) is types.FunctionType else None
            if code is not None:
                names.update(dict.fromkeys(n for n in code.co_names if not n.startswith("__")))
            if len(names) >= _ATTRIBUTE_NAMES:
                break
        slots = members.get("__slots__")
        if type(slots) is str:
            slots = (slots,)
        if type(slots) in (tuple, list):
            names.update(dict.fromkeys(s for s in slots if type(s) is str))
    slotted = {
        name for cls in mro for name, member in _safe_items(cls) if type(member) is types.MemberDescriptorType
    }
    return [n for n in list(names)[:_ATTRIBUTE_NAMES] if n not in described or n in slotted]


def _safe_items(cls: type) -> list[tuple[str, Any]]:
    try:
        return [(k, v) for k, v in list(class_dict(cls).items()) if type(k) is str]
    except Exception:
        return []


def _class_containers(cls: type, roles: _Roles) -> list[tuple[str, Any]]:
    """The containers a class holds as class attributes. The class's namespace is iterated in place:
    the pair its iterator yields is reused, so this makes no object per attribute."""
    try:
        return [(k, v) for k, v in class_dict(cls).items() if roles[type(v)] == _CONTAINER and type(k) is str]
    except Exception:  # changed by another thread meanwhile, or no namespace to read
        return []


def attributes(obj: Any, names: list[str]) -> Iterator[tuple[str, Any]]:
    """`(name, value)` of the instance attributes among `names` that `obj` has."""
    for name in names:
        try:
            yield name, object.__getattribute__(obj, name)
        except Exception:
            continue


def is_instance_type(kind: type) -> bool:
    """Whether objects of `kind` are instances of a class of the host's Python code (a heap type that
    is not a function, module or class), whose attributes may hold containers. Never asks an object:
    `isinstance` would read a proxy's `__class__`."""
    return not issubclass(kind, _SKIPPED) and bool(type_slot(kind, "__flags__", 0) & (1 << 9))


def owner_name(kind: type) -> str:
    """`module.Qualname` of a class, read through `type`'s slots."""
    try:
        module = class_dict(kind).get("__module__")
    except Exception:
        module = None
    qualname = type_slot(kind, "__qualname__", "?")
    return f"{module}.{qualname}" if type(module) is str and module != "builtins" else str(qualname)


_OTHER, _CONTAINER, _CLASS, _INSTANCE = 0, 1, 2, 3


class _Roles(dict[type, int]):
    """What each type met among module globals is to the scan, worked out once per type."""

    def __missing__(self, kind: type) -> int:
        if base_of(kind) is not None:
            role = _CONTAINER
        elif issubclass(kind, type):
            role = _CLASS
        else:
            role = _INSTANCE if is_instance_type(kind) else _OTHER
        self[kind] = role
        return role


def scan_roots(found: Longest, over: Callable[[], bool], library: Longest | None = None) -> bool:
    """Offer every container that module globals hold, by name: globals, the attributes of the classes
    and instances they hold, and the containers a module-level dict holds under a string key; those of
    the standard library's modules to `library` when given (its static tables, a few hundred entries
    each, would crowd out a young cache of the application). False when `over()` said the time was up
    before the scan ended."""
    seen_classes: set[int] = set()
    names_of: dict[type, list[str]] = {}
    roles = _Roles()
    standard = sys.stdlib_module_names
    for module_name, module in list(sys.modules.items()):
        if type(module_name) is not str or module_name.startswith(_OWN_PREFIX):
            continue
        members = module_dict(module)
        if members is None:
            continue
        if over():
            return False
        into = library if library is not None and module_name.partition(".")[0] in standard else found
        try:
            _scan_module(into, module_name, members, roles, seen_classes, names_of)
        except RuntimeError:  # another thread changed the module's globals meanwhile: skipped
            continue
    return True


def _scan_module(
    found: Longest,
    module_name: str,
    members: dict[str, Any],
    roles: _Roles,
    seen_classes: set[int],
    names_of: dict[type, list[str]],
) -> None:
    """Offer the containers one module's globals hold (see `scan_roots`). The globals are iterated in
    place, not copied: the pair the iterator yields is reused, so this makes no object per global."""
    for name, value in members.items():
        role = roles[type(value)]
        if role == _OTHER or type(name) is not str or name.startswith("__"):
            continue
        if role == _CONTAINER:
            path = f"{module_name}.{name}"
            found.offer(value, path)
            if type(value) in MAPPINGS:
                _offer_nested(found, value, path, roles)
        elif role == _CLASS:
            if id(value) not in seen_classes:
                seen_classes.add(id(value))
                for key, member in _class_containers(value, roles):
                    found.offer(member, f"{owner_name(value)}.{key}", owner=value)
        else:
            floor = max(found.low, NAMED_MIN_LEN - 1)
            for attr, member in instance_containers(value, names_of, floor):
                if attr is not None:
                    found.offer(member, f"{module_name}.{name}.{attr}", owner=type(value))


def _offer_nested(found: Longest, mapping: dict[Any, Any], path: str, roles: _Roles) -> None:
    try:
        for key, value in islice(dict.items(mapping), _DICT_KEYS):
            if type(key) is str and roles[type(value)] == _CONTAINER:
                found.offer(value, f"{path}[{key[:40]!r}]")
    except RuntimeError:  # resized by another thread meanwhile
        pass


def instance_containers(
    obj: Any, names_of: dict[type, list[str]], floor: int
) -> Iterator[tuple[str | None, Any]]:
    """`(attribute, container)` for the containers longer than `floor` that an instance holds as
    attributes (inline, or in its own `__dict__`); the attribute is None when no name of the class's
    code reaches the container."""
    owner = type(obj)
    named: dict[int, str] | None = None
    for ref in gc.get_referents(obj):
        kind = type(ref)
        if kind not in MAPPINGS and kind not in SEQUENCES:
            continue
        long = len(ref) > floor
        inner = (
            []
            if kind is not dict
            else [(k, v) for k, v in islice(dict.items(ref), _DICT_KEYS) if _long(v, floor)]
        )
        if not (long or inner):
            continue
        if named is None:
            names = names_of.get(owner)
            if names is None:
                names = names_of[owner] = attribute_names(owner)
            named = {id(value): attr for attr, value in attributes(obj, names)}
        attr = named.get(id(ref))
        if long:
            yield attr, ref
        if attr is None:  # a dict that is no attribute: the instance's own __dict__
            yield from ((k, v) for k, v in inner if type(k) is str)


def _long(value: Any, floor: int) -> bool:
    kind = type(value)
    return (kind in MAPPINGS or kind in SEQUENCES) and len(value) > floor


def offer_attributes(
    mappings: Longest, sequences: Longest, obj: Any, names_of: dict[type, list[str]]
) -> None:
    """Offer the containers `obj` (an instance met in the walk) holds as attributes, named
    `module.Class().attr`."""
    floor = max(min(mappings.low, sequences.low), NAMED_MIN_LEN - 1)
    owner = type(obj)
    for attr, container in instance_containers(obj, names_of, floor):
        found = mappings if type(container) in MAPPINGS else sequences
        if len(container) > found.low and container not in found:
            found.offer(container, None if attr is None else f"{owner_name(owner)}().{attr}", owner=owner)


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


def _items(container: Any, base: Any, step: int, offset: int) -> Iterable[Any]:
    entries = base.items(container) if base is dict else base.__iter__(container)
    return entries if step == 1 else islice(entries, offset, None, step)


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
