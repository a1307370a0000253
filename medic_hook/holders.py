"""Who holds what grows: the containers module globals reach, the allocation sites of their newest
entries, and the line that adds to them, read from a running tracemalloc session.

An allocation site says which line made what stays alive; on-call fixes the holder: the cache, the
registry, the list the objects are kept in. `holders(traces, ...)` takes the longest containers that
module globals reach by name (`medic_hook.containers.scan_roots`) and, for each:

- the sites of its newest entries (the last items of a dict or list, and up to three levels of what
  they hold: a closure's cells, a record's fields), from `tracemalloc.get_object_traceback`: a
  growing site among them is *held by* the container;
- the line that adds to it: the trace of its own table (the array a list, dict or set grows by
  reallocating, found among the session's traces by its exact size, `sys.getsizeof` less that of an
  empty one), else the allocation of its newest entry. Of that trace's frames, the line is the
  innermost outside the standard library, outside the methods of the class that owns the container
  (a registry's `subscribe` appends; the line that calls `BUS.subscribe(...)` is the one to change),
  preferring a function whose code names the container (`CACHE[key] = render(request)` rather than
  the line inside `render` that made the value).

Only containers that took an entry or grew their table since tracing started are returned. The
references taken here are dropped before the reply; nothing is imported, read or kept.
"""

from __future__ import annotations

import gc
import os
import sys
import types
from collections.abc import Iterable
from itertools import compress, islice
from operator import itemgetter
from typing import Any

from medic_hook.containers import (
    NAMED_MIN_LEN,
    Longest,
    base_of,
    class_dict,
    length,
    module_dict,
    scan_roots,
    type_slot,
)
from medic_hook.contents import type_name

KEEP = 16  # containers looked at
ENTRIES = 8  # newest entries of each whose allocation is looked up
DEPTH = 3  # levels of what an entry holds (a closure: function, its cells tuple, a cell, the payload)
PER_ENTRY = 24  # objects looked up per entry
_SHARED = 256  # a dict longer than this met below an entry is a shared table (a module's globals)
_TABLE_MIN = 1024  # smaller tables come from free lists and have common sizes
_SKIPPED = (type, types.ModuleType, types.CodeType, types.BuiltinFunctionType, types.FrameType)
Frame = tuple[str, int]


def holders(traces: list[Any] | None, own: tuple[str, ...], stdlib: Any, over: Any) -> list[dict[str, Any]]:
    """The containers that took entries since tracing started, each with the sites of its newest
    entries and the line that adds to it. `traces` are the session's raw traces (`(domain, size,
    frames innermost first, ...)`), or None; `own` the hook's own file prefixes; `stdlib(filename)`
    tells the standard library's files; `over()` says when the time is up."""
    import tracemalloc

    found, library = Longest(KEEP), Longest(KEEP // 4)
    scan_roots(found, over, library)
    candidates = found.drain(NAMED_MIN_LEN) + library.drain(NAMED_MIN_LEN)
    del found, library
    tables = _table_traces(traces, [c for c, _, _ in candidates])
    out = []
    for container, name, owner in candidates:
        if name is None:
            continue
        entry_frames, sites = _entry_sites(container, tracemalloc, own, stdlib)
        frames = tables.get(id(container)) or entry_frames
        if not sites and id(container) not in tables:
            continue  # took nothing since tracing started
        keys = _key_names(name)
        line = _adding_line(frames, owner, keys, own, stdlib) if frames else None
        base = base_of(type(container))
        out.append(
            {
                "name": name,
                "type": type_name(type(container)),
                "len": length(container, base),
                "holds": _holds(container, base),
                "sites": sites,
                "added_at": None if line is None else f"{line[0]}:{line[1]}",
                "traceback": [f"{f}:{n}" for f, n in frames],
                "by": "table" if id(container) in tables else "entry",
            }
        )
    del candidates
    return out


def _table_traces(traces: list[Any] | None, containers: list[Any]) -> dict[int, list[Frame]]:
    """The frames (innermost first) of the one trace whose size is exactly each container's table."""
    if not traces:
        return {}
    wanted: dict[int, int] = {}
    for container in containers:
        kind = type(container)
        if kind in (dict, list, set) or (base_of(kind) is dict and kind.__name__ != "OrderedDict"):
            table = sys.getsizeof(container) - sys.getsizeof(kind())
            if table >= _TABLE_MIN:
                wanted[table] = -1 if table in wanted else id(container)
    matched: dict[int, list[Any]] = {}
    # the sizes are looked up in C (itemgetter, map, compress): a Python loop over a large table of
    # traces would cost a tenth of a second under the GIL
    for trace in compress(traces, map(wanted.__contains__, map(itemgetter(1), traces))):
        key = wanted[trace[1]]
        if key != -1:
            matched.setdefault(key, []).append(trace[2])
    return {key: [(str(f), int(n)) for f, n in found[0]] for key, found in matched.items() if len(found) == 1}


def _newest(container: Any, base: Any) -> Iterable[Any]:
    """The last entries of a dict, list or deque (the first of a set: it has no order)."""
    try:
        if base is dict:
            return list(islice(reversed(dict.items(container)), ENTRIES))
        if base is list:
            return list.__getitem__(container, slice(-ENTRIES, None))
        if hasattr(base, "__reversed__"):
            return list(islice(base.__reversed__(container), ENTRIES))
        return list(islice(base.__iter__(container), ENTRIES))
    except (RuntimeError, TypeError):  # resized by another thread meanwhile
        return []


def _entry_sites(
    container: Any, tracemalloc: Any, own: tuple[str, ...], stdlib: Any
) -> tuple[list[Frame], list[str]]:
    """The frames of the newest entry's allocation (innermost first), and the sites (innermost frame
    outside the standard library, as `medic_hook.sites` names them) of the newest entries and what
    they hold, most frequent first."""
    counted: dict[str, int] = {}
    newest: list[Frame] = []
    for entry in _newest(container, base_of(type(container))):
        queue, seen = [(entry, 0)], {id(entry)}
        looked = 0
        while queue and looked < PER_ENTRY:
            obj, depth = queue.pop(0)
            looked += 1
            traceback = tracemalloc.get_object_traceback(obj)
            if traceback is not None:
                frames = [(f.filename, f.lineno) for f in reversed(traceback)]
                if not any(f.startswith(own) for f, _ in frames):
                    site = next((f for f in frames if not stdlib(f[0])), frames[0])
                    counted[f"{site[0]}:{site[1]}"] = counted.get(f"{site[0]}:{site[1]}", 0) + 1
                    newest = newest or frames
            if depth < DEPTH:
                for ref in _held(obj):
                    if id(ref) not in seen and _followed(ref):
                        seen.add(id(ref))
                        queue.append((ref, depth + 1))
    return newest, [site for site, _ in sorted(counted.items(), key=lambda item: -item[1])][:4]


def _held(obj: Any) -> list[Any]:
    """What `obj` holds for itself: a function its closure and defaults (not its module's globals)."""
    if type(obj) is types.FunctionType:
        return [obj.__closure__, obj.__defaults__, obj.__kwdefaults__]
    if type(obj) is types.MethodType:
        return [obj.__self__, obj.__func__]
    return gc.get_referents(obj)


def _followed(obj: Any) -> bool:
    kind = type(obj)
    if obj is None or issubclass(kind, _SKIPPED):
        return False
    return not (kind is dict and (len(obj) > _SHARED or "__builtins__" in obj))


def _holds(container: Any, base: Any) -> str | None:
    entries = list(_newest(container, base))[:1]
    if not entries:
        return None
    entry = entries[0]
    if base is dict:
        key, value = entry
        return f"{type_name(type(key))} -> {type_name(type(value))}"
    return type_name(type(entry))


def _key_names(name: str) -> set[str]:
    """The names the code that fills a container uses for it: `app.BUS._subscribers` → BUS and
    _subscribers; `app.CACHE['hot']` → CACHE."""
    path = name.split("[", 1)[0].split(".")
    return {part.removesuffix("()") for part in path[-2:] if part}


def _method_ranges(owner: type | None) -> list[tuple[str, int, int]]:
    """(file, first line, last line) of the functions of `owner`'s classes (not `object`)."""
    if owner is None or issubclass(owner, types.ModuleType):
        return []
    ranges = []
    for cls in type_slot(owner, "__mro__", (owner,)):
        if cls is object:
            continue
        for value in list(class_dict(cls).values()):
            code = _code_of(value)
            if code is not None:
                lines = [line for _, _, line in code.co_lines() if line is not None]
                ranges.append((code.co_filename, min(lines, default=0), max(lines, default=0)))
    return ranges


def _code_of(value: Any) -> types.CodeType | None:
    function = getattr(value, "__func__", value) if type(value) in (staticmethod, classmethod) else value
    return function.__code__ if type(function) is types.FunctionType else None


def _adding_line(
    frames: list[Frame], owner: type | None, keys: set[str], own: tuple[str, ...], stdlib: Any
) -> Frame | None:
    """The frame of `frames` (innermost first) that added to the container (see the module's doc)."""
    methods = _method_ranges(owner)
    candidates = [
        (filename, line)
        for filename, line in frames
        if not filename.startswith(own)
        and not stdlib(filename)
        and not any(filename == f and low <= line <= high for f, low, high in methods)
    ]
    if not candidates:
        return None
    codes = _codes_by_file({filename for filename, _ in candidates})
    for filename, line in candidates:
        for code in _codes_at(codes.get(filename, []), line):
            if keys & set(code.co_names):
                return filename, _line_naming(code, keys, line)
    return candidates[0]


def _line_naming(code: types.CodeType, keys: set[str], line: int) -> int:
    """The first line from `line` on where `code` names one of `keys` (a closure made on one line and
    registered on the next), read with the `dis` module when the host has loaded it; else `line`."""
    dis = sys.modules.get("dis")
    if dis is None:
        return line
    lines = []
    try:
        for instruction in dis.get_instructions(code):
            if instruction.argval in keys and instruction.opname.startswith(("LOAD_", "STORE_")):
                positions = getattr(instruction, "positions", None)
                number = getattr(positions, "lineno", None) or instruction.starts_line
                if isinstance(number, int) and number >= line:
                    lines.append(number)
    except Exception:  # a code object this version of dis cannot read
        return line
    return min(lines, default=line)


def _codes_by_file(files: set[str]) -> dict[str, list[types.CodeType]]:
    """The code objects of the functions that modules defined in `files` hold (their globals and
    classes' methods, nested functions included), by file."""
    found: dict[str, list[types.CodeType]] = {}
    for module in list(sys.modules.values()):
        members = module_dict(module)
        filename = members.get("__file__") if members is not None else None
        if members is None or type(filename) is not str:
            continue
        filename = next((f for f in (filename, os.path.abspath(filename)) if f in files), None)
        if filename is None:
            continue
        codes = found.setdefault(filename, [])
        for value in list(members.values()):
            inner = list(class_dict(value).values()) if issubclass(type(value), type) else [value]
            for member in inner:
                code = _code_of(member)
                if code is not None:
                    codes.extend(_nested(code))
    return found


def _nested(code: types.CodeType) -> list[types.CodeType]:
    out: list[types.CodeType] = []
    queue = [code]
    while queue and len(out) < 1000:
        current = queue.pop()
        out.append(current)
        queue.extend(c for c in current.co_consts if type(c) is types.CodeType)
    return out


def _codes_at(codes: list[types.CodeType], line: int) -> list[types.CodeType]:
    """The code objects among `codes` that have instructions on `line`."""
    return [c for c in codes if any(n == line for _, _, n in c.co_lines())]
