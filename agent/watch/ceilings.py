"""An instance's memory ceilings, layer by layer: the limits its process will really hit.

- `container`: the limit the whole process is judged against (`memory_limit`: the configured one,
  else the cgroup's, else the host's RAM; `Tracker.resolve_memory_limit`);
- for a JVM, what the JVM enforces on itself (the `jvm_limits` probe): `jvm_heap` (`-Xmx`,
  `MaxHeapSize`: a heap leak ends in `java.lang.OutOfMemoryError` there, whatever room the container
  has left), `jvm_direct` (`MaxDirectMemorySize`, else as much as the heap) and `jvm_metaspace`
  (`MaxMetaspaceSize`, only when set: metaspace has no ceiling of its own otherwise).

Each says where it was read (`source`: `config`, `cgroup`, `host`, `VM.flags`, `command line`). A
JVM whose flags cannot be read has no heap ceiling (`source: unknown`): its heap growth is projected
to the container limit, and one `memory_ceilings` event (a warning) says so and why. Every change of
a JVM's ceilings is one `memory_ceilings` event; an instance that is not a JVM gets none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.units import format_bytes

SOURCE, DETAIL, PROBLEM = "jvm_limits_source", "jvm_limits_detail", "jvm_limits_problem"  # the probe's notes
TITLES = {
    "container": "the memory limit",
    "jvm_heap": "Java heap",
    "jvm_direct": "direct buffers",
    "jvm_metaspace": "metaspace",
}


@dataclass(frozen=True, slots=True)
class Ceiling:
    layer: str
    bytes: float | None  # None: not known
    source: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "bytes": self.bytes, "source": self.source, "detail": self.detail}

    def describe(self) -> str:
        size = format_bytes(self.bytes) if self.bytes is not None else "unknown"
        return f"{TITLES[self.layer]} {size} ({self.detail or self.source})"


def ceilings(
    memory_limit: float | None,
    limit_source: str | None,
    notes: Mapping[str, str],
    latest: Mapping[str, float],
) -> list[Ceiling]:
    """An instance's ceilings from its memory limit and its probes' notes and figures, the container's first."""
    container = limit_source or "unknown"
    found = [Ceiling("container", memory_limit, container, container)]
    source = notes.get(SOURCE, "")
    if not source:
        return found  # not a JVM, or not read yet
    detail, problem = notes.get(DETAIL, ""), notes.get(PROBLEM, "")
    heap = latest.get("jvm_heap_max_bytes")
    if source == "unknown" or heap is None:
        why = problem or "no heap ceiling read"
        return [*found, Ceiling("jvm_heap", None, "unknown", f"{why}; the options set no -Xmx")]
    where = "VM.flags" if source == "VM.flags" else f"the {source}; VM.flags not read: {problem}"
    found.append(Ceiling("jvm_heap", heap, source, f"{detail}, from {where}"))
    direct = latest.get("jvm_direct_max_bytes")
    if direct is not None:
        set_ = "MaxDirectMemorySize" in detail
        found.append(
            Ceiling(
                "jvm_direct",
                direct,
                source,
                "MaxDirectMemorySize" if set_ else "MaxDirectMemorySize not set: the heap's",
            )
        )
    metaspace = latest.get("jvm_metaspace_max_bytes")
    if metaspace is not None:
        found.append(Ceiling("jvm_metaspace", metaspace, source, "MaxMetaspaceSize"))
    return found
