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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.core.units import format_bytes
from agent.state.eventlog import EventLog

if TYPE_CHECKING:
    from agent.watch.instances import InstanceState

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


def ceilings(state: InstanceState) -> list[Ceiling]:
    """The instance's ceilings, the container's first."""
    container = state.memory_limit_source or "unknown"
    found = [Ceiling("container", state.memory_limit, container, container)]
    source = state.notes.get(SOURCE, "")
    if not source:
        return found  # not a JVM, or not read yet
    detail, problem = state.notes.get(DETAIL, ""), state.notes.get(PROBLEM, "")
    heap = state.latest.get("jvm_heap_max_bytes")
    if source == "unknown" or heap is None:
        why = problem or "no heap ceiling read"
        return [*found, Ceiling("jvm_heap", None, "unknown", f"{why}; the options set no -Xmx")]
    where = "VM.flags" if source == "VM.flags" else f"the {source}; VM.flags not read: {problem}"
    found.append(Ceiling("jvm_heap", heap, source, f"{detail}, from {where}"))
    direct = state.latest.get("jvm_direct_max_bytes")
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
    metaspace = state.latest.get("jvm_metaspace_max_bytes")
    if metaspace is not None:
        found.append(Ceiling("jvm_metaspace", metaspace, source, "MaxMetaspaceSize"))
    return found


def announce_ceilings(state: InstanceState, events: EventLog) -> None:
    """One `memory_ceilings` event when a JVM's ceilings are first read or change (call it under the
    tracker's lock, after the probes' figures and notes were published)."""
    found = ceilings(state)
    if len(found) < 2:
        return
    heap = found[1]
    text = "; ".join(c.describe() for c in found[1:])
    if heap.bytes is None:
        container = found[0]
        text = (
            f"the JVM's heap ceiling is unknown ({heap.detail}): heap growth is projected to "
            f"{container.describe()} instead; start it with -Xmx, or let medic attach with jcmd"
        )
    else:
        text = f"the JVM's own ceilings: {text}; and {found[0].describe()}"
    if text == state.ceilings_said:
        return
    state.ceilings_said = text
    events.emit(
        "memory_ceilings",
        text,
        instance=state.name,
        severity="warning" if heap.bytes is None else "info",
        ceilings=[c.to_dict() for c in found],
    )
