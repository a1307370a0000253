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

What they hold is counted by `medic_hook.contents`.
"""

from __future__ import annotations

import gc
import heapq
import sys
import types
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

MAPPINGS = frozenset((dict, OrderedDict, defaultdict, Counter))
SEQUENCES = frozenset((list, set, frozenset, deque))
_BASES = (dict, list, set, frozenset, deque)
NAMED_MIN_LEN = 64  # a shorter container is not worth a name (nor a row of its own)
_ATTRIBUTE_NAMES = 256  # names tried as attributes of one class
_DICT_KEYS = 256  # keys of a module-level dict looked into for containers
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
