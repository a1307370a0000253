"""The hook's containers and holders in this process (`medic_hook.containers`, `medic_hook.holders`):
containers named by the module globals that reach them, what they hold counted (in full or as a
scaled sample), never a line of the host's code run to find them, and the line that adds to a holder
found from a real tracemalloc session."""

from __future__ import annotations

import gc
import importlib
import sys
import textwrap
from collections import OrderedDict
from pathlib import Path

import pytest

from medic_hook import containers, contents, sites
from medic_hook.histogram import type_histogram
from medic_hook.holders import holders

MODULE = '''
import os
from collections import OrderedDict


class Untouchable:
    """Any attribute read through the class's own machinery fails the test."""

    def __getattribute__(self, name):
        raise AssertionError(f"the scan read {name!r} through __getattribute__")

    def __getattr__(self, name):
        raise AssertionError(f"the scan read {name!r} through __getattr__")

    @property
    def __class__(self):
        raise AssertionError("the scan asked for __class__")


class Loud(dict):
    def __len__(self):
        raise AssertionError("the scan called a subclass's __len__")

    def items(self):
        raise AssertionError("the scan called a subclass's items")


class Bus:
    handlers = []  # a class attribute

    def __init__(self):
        self._subscribers = []

    def subscribe(self, callback):
        self._subscribers.append(callback)


class Slotted:
    __slots__ = ("rows",)

    def __init__(self):
        self.rows = []


CACHE = {}
NAMES = []
TABLES = {"hot": {}}
BUS = Bus()
SLOTTED = Slotted()
PROXY = Untouchable()
LOUD = Loud()
RECENT = OrderedDict()


def render(i):
    return os.urandom(200)  # renders


def remember(i):
    CACHE[i] = render(i)  # fills


def register(i):
    payload = bytearray(300)  # payload

    def done(event):
        return payload

    BUS.subscribe(done)  # registers


def fill(n):
    for i in range(n):
        remember(i)
        register(i)
        NAMES.append(f"line {i}")
        TABLES["hot"][i] = i * 1.5
        Bus.handlers.append(i)
        SLOTTED.rows.append(str(i))
        LOUD[i] = i
'''


@pytest.fixture
def module(tmp_path: Path):
    """The module above, imported as `leaky_module`, emptied and forgotten afterwards."""
    (tmp_path / "leaky_module.py").write_text(textwrap.dedent(MODULE))
    sys.path.insert(0, str(tmp_path))
    try:
        loaded = importlib.import_module("leaky_module")
        yield loaded
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("leaky_module", None)


def line(module, marker: str) -> str:
    lines = Path(module.__file__).read_text().splitlines()
    return (
        f"{module.__file__}:{next(i for i, t in enumerate(lines, 1) if t.rstrip().endswith('# ' + marker))}"
    )


def test_the_roots_name_globals_attributes_and_nested_dicts_without_running_the_host_s_code(module):
    module.fill(300)
    found = containers.Longest(64)
    assert containers.scan_roots(found, lambda: False)
    names = {name for _, name, _ in found.drain()}
    expected = {
        "leaky_module.CACHE",
        "leaky_module.NAMES",
        "leaky_module.TABLES['hot']",
        "leaky_module.BUS._subscribers",
        "leaky_module.Bus.handlers",
        "leaky_module.SLOTTED.rows",
        "leaky_module.LOUD",
    }
    assert expected <= names, sorted(n for n in names if n.startswith("leaky"))


def test_the_histogram_counts_what_an_untracked_module_dict_holds_and_names_it(module):
    module.fill(3000)
    assert not gc.is_tracked(module.CACHE)  # int -> bytes only: the collector never sees it
    reply = type_histogram(top=200, budget_s=10)
    cache = next(c for c in reply["containers"] if c["name"] == "leaky_module.CACHE")
    assert cache["len"] == 3000 and cache["holds"] == "int -> bytes" and cache["complete"]
    assert cache["content_bytes"] >= 3000 * 200
    counts = {row["type"]: row["count"] for row in reply["types"]}
    assert counts["bytes"] >= 3000 and counts["float"] >= 3000  # TABLES['hot'] holds floats
    assert reply["contents_complete"] and reply["sample_fraction"] == 1.0


def test_a_long_container_is_counted_from_a_sample_scaled_to_its_length() -> None:
    lines = [f"request {i} " + "x" * (i % 50) for i in range(55_000)]
    counts: dict[type, list[int]] = {}
    summary, added, cut = contents.count_contents(lines, "lines", counts, lambda: False)
    assert summary["sampled"] > 1 and not cut and summary["complete"]
    assert counts[str][0] == added == len(lines)  # each sampled item stands for `len / sampled` items
    exact = sum(map(sys.getsizeof, lines))
    assert abs(counts[str][1] - exact) < 0.02 * exact


def test_sizes_summed_per_type_are_those_sys_getsizeof_gives() -> None:
    by_type: dict[type, list[object]] = {}
    for obj in [*gc.get_objects(), b"x" * 5000, 10**40, "é" * 40, OrderedDict(a=1), 2.5]:
        by_type.setdefault(type(obj), []).append(obj)
    for kind, objects in by_type.items():
        assert contents.measure(objects) == (len(objects), sum(map(sys.getsizeof, objects))), kind


def test_a_session_names_the_holders_and_the_lines_that_add_to_them(module):
    import tracemalloc

    was_tracing = tracemalloc.is_tracing()
    sites.start(frames=5, duration_s=60, max_memory=64 * 2**20)
    try:
        module.fill(5000)
        taken = tracemalloc.take_snapshot()
        own = (str(Path(sites.__file__).parent) + "/", tracemalloc.__file__)
        found = holders(taken.traces._traces, own, sites._stdlib, lambda: False)
    finally:
        if not was_tracing:
            sites.stop()
    by_name = {h["name"]: h for h in found}
    bus = by_name["leaky_module.BUS._subscribers"]
    assert bus["added_at"] == line(module, "registers"), bus  # not the append inside Bus.subscribe
    assert line(module, "payload") in bus["sites"] and bus["holds"] == "function", bus
    cache = by_name["leaky_module.CACHE"]
    assert cache["added_at"] == line(module, "fills"), cache  # not the line inside render()
    assert line(module, "renders") in cache["sites"] and cache["holds"] == "int -> bytes", cache
