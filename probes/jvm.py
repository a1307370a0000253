"""The `jvm` probe: heap figures, Native Memory Tracking and class histograms of JVM targets, via `jcmd`.

One `jcmd PID -f FILE` run per collection asks for `GC.heap_info` (every `heap_interval`),
`VM.native_memory summary` (answered only when the JVM runs with `-XX:NativeMemoryTracking`) and,
every `interval` (default 15 min), `GC.class_histogram -all`. The live variant (no `-all`) forces a
full GC, a latency blip on a serving JVM: it is used only with `histograms.jvm.live: true`, and then
at most every `live_floor`. jcmd is itself a JVM (about 0.2 s of CPU per run), hence the slow schedule.

jcmd's attach handshake sends SIGQUIT, which kills a process that is not a JVM and makes a JVM with
`-XX:+DisableAttachMechanism` print a thread dump: the probe checks first (libjvm.so mapped, flags
in the command line and `JAVA_TOOL_OPTIONS`) and reports `ProbeUnavailable` instead of attaching.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import ClassVar

from agent import histograms
from agent.config import JvmHistograms
from agent.errors import ProbeAccessDenied, ProbeError, ProbeUnavailable, StoreError, TargetGone
from agent.records import ProbeResult, ProbeTarget, Sample
from probes.base import Schedule
from probes.jvmtext import (
    ClassHistogram,
    HeapInfo,
    JcmdOutputError,
    NativeMemory,
    attach_failure,
    parse_class_histogram,
    parse_heap_info,
    parse_native_memory,
    split_report,
)

JCMD_HOWTO = "install a JDK with jcmd (Debian: openjdk-17-jdk-headless) or set histograms.jvm.jcmd"
_OPTION_VARS = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")


@dataclass
class _Due:
    next_heap: float = 0.0
    next_histogram: float = 0.0
    last_live: float = float("-inf")
    checked: bool = False  # the process was found to be a JVM that accepts attach
    jvm: bool | None = None  # None: not looked yet


class JvmProbe:
    name: ClassVar[str] = "jvm"
    schedule: ClassVar[Schedule] = "slow"

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._due: dict[tuple[str, int, float], _Due] = {}
        self._lock = threading.Lock()

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        settings = histograms.settings_for(target, "jvm", JvmHistograms)
        key = (target.instance, target.pid, target.start_time)
        with self._lock:
            due = self._due.setdefault(key, _Due())
        want_heap = now >= due.next_heap
        want_histogram = now >= due.next_histogram
        if not (want_heap or want_histogram):
            return ProbeResult()
        if due.jvm is None:
            due.jvm = is_jvm(target.pid, self.proc)
        if not due.jvm:
            return ProbeResult()  # not a JVM: nothing to say (other probes cover it)
        if not due.checked:
            refusal = attach_refusal(target.pid, self.proc)
            if refusal is not None:
                raise refusal
            due.checked = True
        live = want_histogram and settings.live and now - due.last_live >= settings.live_floor
        commands = ["GC.heap_info", "VM.native_memory summary"]
        if want_histogram:
            commands.append("GC.class_histogram" if live else "GC.class_histogram -all")
            due.next_histogram = now + settings.interval  # a failed run waits its interval too
        due.next_heap = now + settings.heap_interval
        report = split_report(self._jcmd(target.pid, commands, settings))
        result = ProbeResult()
        heap = _parse(result, parse_heap_info, report.heap_info, "GC.heap_info")
        if heap is not None:
            _heap_samples(result, target.instance, now, heap)
        nmt = _parse(result, parse_native_memory, report.native_memory, "VM.native_memory summary")
        if nmt is not None:
            _nmt_samples(result, target, now, nmt)
        if want_histogram:
            histogram = _parse(result, parse_class_histogram, report.class_histogram, "GC.class_histogram")
            if histogram is not None:
                if live:
                    due.last_live = now
                _histogram_samples(result, target, now, histogram, live, heap)
        return result

    def forget(self, target: ProbeTarget) -> None:
        with self._lock:
            self._due.pop((target.instance, target.pid, target.start_time), None)

    def _jcmd(self, pid: int, commands: list[str], settings: JvmHistograms) -> str:
        jcmd = find_jcmd(pid, settings.jcmd, self.proc)
        fd, path = tempfile.mkstemp(prefix="medic-jcmd-", suffix=".txt")  # 0600, removed below
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write("\n".join(commands) + "\n")
            done = subprocess.run(
                [jcmd, str(pid), "-f", path],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=settings.timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise ProbeError(
                f"jcmd did not finish within {settings.timeout:.0f}s on the JVM {pid} (a long GC pause or a "
                "huge heap?); raise histograms.jvm.timeout"
            ) from None
        except OSError as exc:
            raise ProbeUnavailable(f"cannot run {jcmd}: {exc.strerror or exc}; {JCMD_HOWTO}") from None
        finally:
            os.unlink(path)
        if done.returncode != 0 or "Exception" in done.stderr:
            if not os.path.exists(f"{self.proc}/{pid}"):
                raise TargetGone(f"the JVM {pid} is gone")
            raise attach_failure(pid, done.returncode, done.stdout, done.stderr)
        return done.stdout


def _parse(result: ProbeResult, parse, text: str | None, what: str):
    """A parsed section, or None with the problem recorded (a missing or odd section is a partial failure)."""
    if text is None:
        result.problems.append(JcmdOutputError(f"{what}: jcmd's answer has no such section"))
        return None
    try:
        return parse(text)
    except JcmdOutputError as exc:
        result.problems.append(exc)
        return None


def _heap_samples(result: ProbeResult, instance: str, now: float, heap: HeapInfo) -> None:
    figures = {
        "jvm_heap_used_bytes": heap.used,
        "jvm_heap_committed_bytes": heap.committed,
        "jvm_heap_after_gc_bytes": heap.after_gc,
        "jvm_metaspace_used_bytes": heap.metaspace_used,
    }
    result.samples.extend(Sample(instance, m, now, float(v)) for m, v in figures.items() if v is not None)


def _nmt_samples(result: ProbeResult, target: ProbeTarget, now: float, nmt: NativeMemory) -> None:
    figures = {
        "jvm_nmt_committed_bytes": nmt.committed,
        "jvm_nmt_malloc_bytes": nmt.malloc,
        "jvm_nmt_heap_committed_bytes": nmt.heap_committed,
    }
    result.samples.extend(
        Sample(target.instance, m, now, float(v)) for m, v in figures.items() if v is not None
    )
    rows = [histograms.HistogramRow(name, 0.0, float(c)) for name, (_r, c) in nmt.categories.items()]
    snapshot = histograms.Snapshot(
        target.instance,
        "nmt",
        now,
        rows,
        0.0,
        float(nmt.committed),
        target.pid,
        target.start_time,
        len(rows),
        {"reserved_bytes": nmt.reserved, "malloc_bytes": nmt.malloc},
    )
    _publish(result, snapshot)


def _histogram_samples(
    result: ProbeResult,
    target: ProbeTarget,
    now: float,
    histo: ClassHistogram,
    live: bool,
    heap: HeapInfo | None,
) -> None:
    result.samples.append(Sample(target.instance, "jvm_histogram_bytes", now, float(histo.total_bytes)))
    result.samples.append(
        Sample(target.instance, "jvm_histogram_instances", now, float(histo.total_instances))
    )
    rows = [histograms.HistogramRow(r.name, float(r.instances), float(r.bytes), r.module) for r in histo.rows]
    meta = {"variant": "live" if live else "all", "bad_rows": histo.bad_rows}
    if heap is not None:
        meta["collector"] = heap.collector
    snapshot = histograms.Snapshot(
        target.instance,
        "jvm",
        now,
        rows,
        float(histo.total_instances),
        float(histo.total_bytes),
        target.pid,
        target.start_time,
        len(rows),
        meta,
    )
    _publish(result, snapshot)


def _publish(result: ProbeResult, snapshot: histograms.Snapshot) -> None:
    try:
        histograms.publish(snapshot)
    except StoreError as exc:
        result.problems.append(exc)


# ------------------------------------------------------------------------------- before attaching
def is_jvm(pid: int, proc: str = "/proc") -> bool:
    """Whether `pid` maps libjvm.so; raises `TargetGone` / `ProbeAccessDenied`."""
    try:
        with open(f"{proc}/{pid}/maps", encoding="utf-8", errors="replace") as handle:
            return any("/libjvm.so" in line for line in handle)
    except FileNotFoundError:
        raise TargetGone(f"process {pid} is gone") from None
    except PermissionError:
        raise ProbeAccessDenied(
            f"cannot read /proc/{pid}/maps to tell whether it is a JVM: run medic as its user or as root"
        ) from None


def attach_refusal(pid: int, proc: str = "/proc") -> ProbeError | None:
    """Why jcmd must not attach to `pid` (its SIGQUIT would do harm), or None when it may."""
    try:
        if not is_jvm(pid, proc):
            return ProbeUnavailable(f"pid {pid} is not a JVM (no libjvm.so mapped): no class histograms")
        with open(f"{proc}/{pid}/cmdline", "rb") as handle:
            argv = handle.read().decode("utf-8", errors="replace").split("\0")
    except FileNotFoundError:
        return TargetGone(f"process {pid} is gone")
    except ProbeError as exc:
        return exc
    options = [*argv, *_environ_options(pid, proc)]
    if "-XX:+DisableAttachMechanism" in options:
        return ProbeUnavailable(
            f"the JVM {pid} runs with -XX:+DisableAttachMechanism: medic does not attach (the attempt would "
            "make it print a thread dump); remove the flag to get class histograms"
        )
    if ("-Xrs" in options or "-XX:+ReduceSignalUsage" in options) and not _attach_socket(pid, proc):
        return ProbeUnavailable(
            f"the JVM {pid} runs with -Xrs and its attach socket /tmp/.java_pid* is missing: attaching would "
            "send a SIGQUIT it does not handle (it would exit); restart it to recreate the socket"
        )
    return None


def _environ_options(pid: int, proc: str) -> list[str]:
    try:
        with open(f"{proc}/{pid}/environ", "rb") as handle:
            entries = handle.read().decode("utf-8", errors="replace").split("\0")
    except OSError:
        return []
    words = []
    for entry in entries:
        name, _, value = entry.partition("=")
        if name in _OPTION_VARS:
            words.extend(value.split())
    return words


def _attach_socket(pid: int, proc: str) -> bool:
    nspid = str(pid)
    try:
        with open(f"{proc}/{pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("NSpid:"):
                    nspid = line.split()[-1]
    except OSError:
        pass
    return os.path.exists(f"{proc}/{pid}/root/tmp/.java_pid{nspid}")


def find_jcmd(pid: int, configured: str | None = None, proc: str = "/proc") -> str:
    """`configured`, else the jcmd beside the target's own `java`, else the one on PATH."""
    if configured:
        return configured
    try:
        sibling = os.path.join(os.path.dirname(os.readlink(f"{proc}/{pid}/exe")), "jcmd")
        if os.access(sibling, os.X_OK):
            return sibling
    except OSError:
        pass
    found = shutil.which("jcmd")
    if found is None:
        raise ProbeUnavailable(f"no jcmd found for the JVM {pid}: {JCMD_HOWTO}")
    return found
