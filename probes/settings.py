"""The settings of the histogram probes: an instance's `histograms.jvm`, `histograms.python` and
`histograms.heap_profiles` (docs/histograms.md). They live beside the probes, which need nothing of the
config package; the config model validates the same classes on load (`HistogramsSpec`).

A probe reads its section from `ProbeTarget.settings` (the instance's config as plain data) with
`settings_for`, and `opted_in` for a section that is off by default; a section that does not
validate (a hand-made target) is a `ProbeError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import Field, ValidationError

from agent.core.errors import ProbeError
from agent.core.records import ProbeTarget
from agent.core.types import DAY, HOUR, MAX_DURATION, Duration, Size, Strict, within

M = TypeVar("M", bound=Strict)


class JvmRetainers(Strict):
    """What holds a JVM heap leak: a JFR recording of old-object samples, dumped with their paths to the
    GC roots (docs/histograms.md)."""

    on_leak: bool = True  # record when a leak finding opens on the instance
    record: Annotated[Duration, within(1, HOUR)] = 300.0  # leaked objects allocated meanwhile are sampled


class JvmHistograms(Strict):
    """JVM targets (docs/histograms.md): class histograms, heap figures and NMT through jcmd."""

    interval: Annotated[Duration, within(1, DAY)] = 900.0  # GC.class_histogram
    heap_interval: Annotated[Duration, within(1, DAY)] = 60.0  # GC.heap_info, VM.native_memory
    live: bool = False  # the live histogram forces a full GC; -all (garbage included) otherwise
    live_floor: Annotated[Duration, within(60, MAX_DURATION)] = 3600.0  # at most one live histogram so often
    timeout: Annotated[Duration, within(1, HOUR)] = 60.0
    jcmd: str | None = None  # default: the jcmd beside the target's java, else PATH
    retainers: JvmRetainers = Field(default_factory=JvmRetainers)


class PythonSites(Strict):
    """Python allocation sites through the hook's tracemalloc session (docs/histograms.md)."""

    on_leak: bool = True  # start a session when a leak finding opens on the instance
    frames: int = Field(5, ge=1, le=25)  # frames kept per allocation (tracemalloc's cost grows with them)
    duration: Annotated[Duration, within(1, 6 * HOUR)] = 900.0  # the session stops itself after this
    max_memory: Annotated[Size, Field(ge=2**20, le=2**28)] = 16 * 2**20  # tracemalloc's own memory, at most
    interval: Annotated[Duration, within(0.5, HOUR)] = 60.0  # a snapshot this often while tracing
    top: int = Field(50, ge=1, le=500)


class PythonHistograms(Strict):
    """Python targets with the in-process hook: type histograms (gc-tracked objects, and what the
    longest containers hold), the containers module globals name and, while a session runs,
    allocation sites with what holds them."""

    interval: Annotated[Duration, within(1, DAY)] = 300.0
    top: int = Field(200, ge=1, le=1000)
    # the walk's CPU in the target (it holds the GIL): a larger heap is sampled to stay within it
    budget: Annotated[Duration, within(0.001, 60)] = 1.0
    sites: PythonSites = Field(default_factory=PythonSites)


class HeapProfiles(Strict):
    """Native heap profiles: dumped through the hook into `dir`, or read from jemalloc/gperftools dumps there."""

    dir: Path
    interval: Annotated[Duration, within(1, DAY)] = 600.0
    frames: int = Field(1, ge=1, le=8)  # frames outside the allocator that name a site
    keep: int = Field(8, ge=2, le=1000)  # dumps medic wrote that are kept on disk


def opted_in(target: ProbeTarget, key: str) -> bool:
    """Whether the instance has a `histograms.<key>` section (`heap_profiles` is off without one)."""
    return (target.settings.get("histograms") or {}).get(key) is not None


def settings_for(target: ProbeTarget, key: str, model: type[M]) -> M:
    """The instance's `histograms.<key>` settings as `model` (its defaults when absent); settings that
    do not validate (a hand-made target) are a `ProbeError`, not a crash."""
    raw = (target.settings.get("histograms") or {}).get(key)
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem.get("loc", ()))
        raise ProbeError(f"invalid histograms.{key}.{where}: {problem.get('msg')}") from None
