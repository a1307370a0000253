"""Pure parser of `jfr print --events jdk.OldObjectSample FILE`: objects the JVM sampled as they were
allocated and found still alive at the dump, each with the chain of references that holds it, up to
its GC root (`JFR.dump path-to-gc-roots=true`), and what those chains say holds a leak.

One sample prints as (OpenJDK 17; captured outputs in `tests/fixtures/jvm/old_objects_*`):

    jdk.OldObjectSample {
      ...
      object =  [
        byte[1024]
        value : java.util.HashMap$Node
        [6059] : java.util.HashMap$Node[16384]
        table : java.util.HashMap Size: 10800
        CACHE : java.lang.Class Class Name: MapLeak
      ]
      root = { description = "Thread Name: main"  system = "Threads"  type = "Stack Variable" }

Each line after the object is the field that holds the line above it and the type of its holder:
here the `byte[]` is the `value` of a `HashMap$Node`, in the `table` of a `HashMap` of 10800 entries,
in the static field `CACHE` of the class `MapLeak`. The retainer of a sample is that static field (or
its GC root) and the container it holds. The text comes from a recording the target wrote: bounded,
and a line that is not in this shape is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

MAX_TEXT = 8 * 2**20
MAX_SAMPLES = 2048
MAX_CHAIN = 64
_LINK = re.compile(r"(\S{1,200}) : (\S{1,500})(?: (.{0,200}))?")
_ARRAY = re.compile(r"(.+?)\[\d*\]")
_PRIMITIVES = {
    "boolean": "Z",
    "byte": "B",
    "char": "C",
    "short": "S",
    "int": "I",
    "long": "J",
    "float": "F",
    "double": "D",
}


@dataclass(frozen=True, slots=True)
class Link:
    """One holder in a chain: the `field` (or `[index]`) of an object of `holder` type; `note` is what
    jfr adds (`Size: 10800`, `Class Name: MapLeak`)."""

    field: str
    holder: str
    note: str


@dataclass(frozen=True, slots=True)
class OldObject:
    type: str  # as a class histogram names it: `[B`, `java.lang.String`
    chain: tuple[Link, ...]  # from the object's holder up to the root
    root: str  # how jfr describes the GC root (`Threads: Stack Variable, Thread Name: main`), or ""


@dataclass(frozen=True, slots=True)
class Retainer:
    what: str  # the container that holds the objects: `java.util.HashMap of 10800 entries`
    where: str  # what holds the container: `static field MapLeak.CACHE`
    holds: tuple[str, ...]  # the classes on the chain below it (the objects, their holders)


def histogram_name(java: str) -> str:
    """A class as jfr prints it (`byte[1024]`, `java.lang.Object[16]`, `Foo`) as the class histogram
    names it (`[B`, `[Ljava.lang.Object;`, `Foo`)."""
    base, dims = java, 0
    while match := _ARRAY.fullmatch(base):
        base, dims = match.group(1), dims + 1
    if not dims:
        return java
    element = _PRIMITIVES.get(base) or f"L{base};"
    return "[" * dims + element


def parse_old_objects(text: str) -> list[OldObject]:
    """Every `jdk.OldObjectSample` with its object and chain (an object with no chain has no path to a
    GC root in the recording: garbage by the dump, or a chain not collected)."""
    found: list[OldObject] = []
    lines = iter(text[:MAX_TEXT].splitlines())
    for line in lines:
        if len(found) >= MAX_SAMPLES:
            break
        stripped = line.strip()
        if not stripped.startswith("object ="):
            continue
        value = stripped.partition("=")[2].strip()
        items = _list(lines) if value == "[" else [value]
        if not items or not items[0]:
            continue
        chain = tuple(link for item in items[1:MAX_CHAIN] if (link := _link(item)) is not None)
        found.append(OldObject(histogram_name(items[0].split()[0]), chain, _root(lines)))
    return found


def _list(lines: Iterator[str]) -> list[str]:
    items: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped == "]" or len(items) > MAX_CHAIN:
            break
        if stripped and stripped != "...":
            items.append(stripped)
    return items


def _link(item: str) -> Link | None:
    match = _LINK.fullmatch(item)
    if match is None:
        return None
    return Link(match.group(1), histogram_name(match.group(2)), (match.group(3) or "").strip())


def _root(lines: Iterator[str]) -> str:
    """The `root = {...}` block after the object list (`root = N/A`: none)."""
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("root ="):
            if not stripped.endswith("{"):
                return ""
            fields = {}
            for inner in lines:
                inner = inner.strip()
                if inner == "}":
                    break
                key, _, value = inner.partition(" = ")
                fields[key] = value.strip('"')[:200]
            parts = [fields.get("system", ""), fields.get("type", "")]
            described = ": ".join(p for p in parts if p)
            return f"{described}, {fields['description']}" if fields.get("description") else described
        if stripped == "}":
            return ""
    return ""


def retainer(sample: OldObject) -> Retainer | None:
    """What holds a sample: the static field at the top of its chain and the container it holds, else
    its GC root and the topmost holder; None for a sample without a chain."""
    chain = sample.chain
    if not chain:
        return None
    top = chain[-1]
    if top.holder == "java.lang.Class" and top.note.startswith("Class Name: "):
        where = f"static field {top.note.removeprefix('Class Name: ')}.{top.field}"
        held = chain[-2] if len(chain) >= 2 else None
        what = _container(held.holder, held.note) if held is not None else sample.type
        below = chain[:-2]
    else:
        where = sample.root or f"{top.field} of {top.holder}"
        what = _container(top.holder, top.note)
        below = chain[:-1]
    holds = tuple(dict.fromkeys([sample.type, *(link.holder for link in below)]))
    return Retainer(what, where, holds)


def _container(holder: str, note: str) -> str:
    size = note.removeprefix("Size: ") if note.startswith("Size: ") else ""
    return f"{holder} of {size} entries" if size.isdigit() else holder
