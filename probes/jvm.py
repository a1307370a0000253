"""The `jvm` probe: heap figures, Native Memory Tracking and class histograms of JVM targets, via `jcmd`.

One `jcmd PID -f FILE` run per collection asks for `GC.heap_info` (every `heap_interval`),
`VM.native_memory summary` (answered only when the JVM runs with `-XX:NativeMemoryTracking`) and,
every `interval` (default 15 min), `GC.class_histogram -all`. The live variant (no `-all`) forces a
full GC, a latency blip on a serving JVM: it is used only with `histograms.jvm.live: true`, and then
at most every `live_floor`. jcmd is itself a JVM (about 0.2 s of CPU per run), hence the slow schedule.

jcmd's attach handshake sends SIGQUIT, which kills a process that is not a JVM and makes a JVM with
`-XX:+DisableAttachMechanism` print a thread dump: the probe checks first (libjvm.so mapped, flags
in the command line and `JAVA_TOOL_OPTIONS`) and reports `ProbeUnavailable` instead of attaching.

medic is often root and the JVM is not: jcmd is run only from a trusted path (root's or medic's, no
group/other write on the way: `find_jcmd`), never from a JDK the target's user can change, and it
runs with the JVM's uid and gid (which attach requires anyway), its command file in a private 0700
directory of that user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from agent.core.errors import (
    ProbeError,
    ProbeUnavailable,
    TargetGone,
    UnsafePath,
)
from agent.core.histograms import HistogramRow, Snapshot
from agent.core.records import ProbeResult, ProbeTarget, Sample
from probes.base import Schedule
from probes.jvmflags import OPTION_VARS
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
from probes.linux.fstrust import check_trusted_path, trusted_program
from probes.linux.helpers import process_ids, run_as
from probes.linux.maps import read_maps, resident_within
from probes.linux.procfs import HOST_ROOT, proc_path, read_cmdline, read_environ, read_nspid
from probes.settings import JvmHistograms, settings_for

DIRECT_CATEGORY = "Other"  # NMT's category of Unsafe.allocateMemory: direct ByteBuffers
JCMD_HOWTO = "install a JDK with jcmd (Debian: openjdk-17-jdk-headless) or set histograms.jvm.jcmd"


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

    def __init__(self, root: Path = HOST_ROOT) -> None:
        self.root = root
        self._due: dict[tuple[str, int, float], _Due] = {}
        self._lock = threading.Lock()

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        settings = settings_for(target, "jvm", JvmHistograms)
        key = (target.instance, target.pid, target.start_time)
        with self._lock:
            due = self._due.setdefault(key, _Due())
        want_heap = now >= due.next_heap
        want_histogram = now >= due.next_histogram
        if not (want_heap or want_histogram):
            return ProbeResult()
        if due.jvm is None:
            due.jvm = is_jvm(target.pid, self.root)
        if not due.jvm:
            return ProbeResult()  # not a JVM: nothing to say (other probes cover it)
        if not due.checked:
            refusal = attach_refusal(target.pid, self.root)
            if refusal is not None:
                raise refusal
            due.checked = True
        live = want_histogram and settings.live and now - due.last_live >= settings.live_floor
        commands = ["GC.heap_info", "VM.native_memory summary"]
        if want_histogram:
            commands.append("GC.class_histogram" if live else "GC.class_histogram -all")
            due.next_histogram = now + settings.interval  # a failed run waits its interval too
        due.next_heap = now + settings.heap_interval
        report = split_report(run_jcmd(target.pid, commands, settings, self.root))
        result = ProbeResult()
        heap = _parse(result, parse_heap_info, report.heap_info, "GC.heap_info")
        if heap is not None:
            _heap_samples(result, target.instance, now, heap)
            _resident_samples(result, target, now, heap, self.root)
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


def run_jcmd(pid: int, commands: list[str], settings: JvmHistograms, root: Path = HOST_ROOT) -> str:
    """jcmd's answer to `commands` from the JVM `pid`, run as the JVM's user within `settings.timeout`
    (`find_jcmd` says which jcmd); its failures as the probe errors that say what to do."""
    jcmd = find_jcmd(pid, settings.jcmd, root)
    as_target = run_as(process_ids(pid, root), os.geteuid())
    workdir = _command_dir(commands, as_target)
    try:
        done = subprocess.run(
            [str(jcmd), str(pid), "-f", os.path.join(workdir, "commands")],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=settings.timeout,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            **as_target,
        )
    except subprocess.TimeoutExpired:
        raise ProbeError(
            f"jcmd did not finish within {settings.timeout:.0f}s on the JVM {pid} (a long GC pause or a "
            "huge heap?); raise histograms.jvm.timeout"
        ) from None
    except OSError as exc:
        raise ProbeUnavailable(f"cannot run {jcmd}: {exc.strerror or exc}; {JCMD_HOWTO}") from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # fd-based: safe in a directory the target owned
    if done.returncode != 0 or "Exception" in done.stderr:
        if not os.path.exists(proc_path(root, pid)):
            raise TargetGone(f"the JVM {pid} is gone")
        raise attach_failure(pid, done.returncode, done.stdout, done.stderr)
    return done.stdout


def _command_dir(commands: list[str], as_target: dict[str, Any]) -> str:
    """A fresh 0700 directory holding jcmd's command file (0600): owned by the user jcmd runs as,
    so that it can read it and nobody else can."""
    workdir = tempfile.mkdtemp(prefix="medic-jcmd-")
    try:
        fd = os.open(
            os.path.join(workdir, "commands"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
        )
        with os.fdopen(fd, "w") as handle:
            handle.write("\n".join(commands) + "\n")
            if as_target:
                os.fchown(handle.fileno(), as_target["user"], as_target["group"])
        if as_target:
            os.chown(workdir, as_target["user"], as_target["group"])
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return workdir


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


def _resident_samples(
    result: ProbeResult, target: ProbeTarget, now: float, heap: HeapInfo, root: Path
) -> None:
    """The heap's resident pages (the mappings of its address range in smaps) and the rest of the RSS:
    the JVM's memory outside the heap. Committed heap is not all resident, and a heap that widens its
    GC sawtooth touches more of it: RSS grows, and only this split tells that from native growth."""
    if heap.span is None:
        return  # ZGC prints no range (and maps its heap several times over)
    try:
        inside, total = resident_within(target.pid, *heap.span, root)
    except TargetGone:
        raise
    except ProbeError as exc:
        result.problems.append(exc)
        return
    result.samples.append(Sample(target.instance, "jvm_heap_resident_bytes", now, float(inside)))
    result.samples.append(Sample(target.instance, "jvm_native_bytes", now, float(total - inside)))


def _nmt_samples(result: ProbeResult, target: ProbeTarget, now: float, nmt: NativeMemory) -> None:
    figures = {
        "jvm_nmt_committed_bytes": nmt.committed,
        "jvm_nmt_malloc_bytes": nmt.malloc,
        "jvm_nmt_heap_committed_bytes": nmt.heap_committed,
        "jvm_direct_bytes": nmt.categories.get(DIRECT_CATEGORY, (0, None))[1],
    }
    result.samples.extend(
        Sample(target.instance, m, now, float(v)) for m, v in figures.items() if v is not None
    )
    rows = [HistogramRow(name, 0.0, float(c)) for name, (_r, c) in nmt.categories.items()]
    snapshot = Snapshot(
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
    result.snapshots.append(snapshot)


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
    rows = [HistogramRow(r.name, float(r.instances), float(r.bytes), r.module) for r in histo.rows]
    meta = {"variant": "live" if live else "all", "bad_rows": histo.bad_rows}
    if heap is not None:
        meta["collector"] = heap.collector
    snapshot = Snapshot(
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
    result.snapshots.append(snapshot)


# ------------------------------------------------------------------------------- before attaching
def is_jvm(pid: int, root: Path = HOST_ROOT) -> bool:
    """Whether `pid` maps libjvm.so; raises `TargetGone` / `ProbeAccessDenied`."""
    return any("/libjvm.so" in mapping.path for mapping in read_maps(pid, root))


def attach_refusal(pid: int, root: Path = HOST_ROOT) -> ProbeError | None:
    """Why jcmd must not attach to `pid` (its SIGQUIT would do harm), or None when it may."""
    try:
        if not is_jvm(pid, root):
            return ProbeUnavailable(f"pid {pid} is not a JVM (no libjvm.so mapped): no class histograms")
        argv = read_cmdline(pid, root)
    except ProbeError as exc:
        return exc
    options = [*argv, *_environ_options(pid, root)]
    if "-XX:+DisableAttachMechanism" in options:
        return ProbeUnavailable(
            f"the JVM {pid} runs with -XX:+DisableAttachMechanism: medic does not attach (the attempt would "
            "make it print a thread dump); remove the flag to get class histograms"
        )
    if ("-Xrs" in options or "-XX:+ReduceSignalUsage" in options) and not _attach_socket(pid, root):
        return ProbeUnavailable(
            f"the JVM {pid} runs with -Xrs and its attach socket /tmp/.java_pid* is missing: attaching would "
            "send a SIGQUIT it does not handle (it would exit); restart it to recreate the socket"
        )
    return None


def _environ_options(pid: int, root: Path) -> list[str]:
    try:
        env = read_environ(pid, root)
    except ProbeError:
        return []
    return [word for name in OPTION_VARS for word in env.get(name, "").split()]


def _attach_socket(pid: int, root: Path) -> bool:
    try:
        ns_pid = read_nspid(pid, root)[-1]
    except ProbeError:
        ns_pid = pid
    return os.path.exists(proc_path(root, pid, "root", "tmp", f".java_pid{ns_pid}"))


def find_jcmd(pid: int, configured: str | None = None, root: Path = HOST_ROOT) -> Path:
    """The jcmd to run for `pid`: `configured`, else the one beside the target's own `java`, else the one
    on PATH. Each must be root's or medic's and writable by nobody else (`fstrust.check_trusted_path`):
    a jcmd in a JDK another user can change is refused, never run, since medic may be root."""
    if configured:
        try:
            found = trusted_program(configured)
        except UnsafePath as exc:
            raise ProbeUnavailable(f"histograms.jvm.jcmd {configured} is not safe to run: {exc}") from None
        if found is None:
            raise ProbeUnavailable(
                f"histograms.jvm.jcmd {configured} is not an executable file: {JCMD_HOWTO}"
            )
        return found
    sibling = _sibling_jcmd(pid, root)
    if sibling is not None:
        try:
            return check_trusted_path(sibling)
        except UnsafePath as exc:
            raise ProbeUnavailable(
                f"the JVM {pid} runs from a JDK another user can change ({exc}): medic does not run "
                f"{sibling}; set histograms.jvm.jcmd to a jcmd owned by root (such as /usr/bin/jcmd)"
            ) from None
    try:
        found = trusted_program("jcmd")
    except UnsafePath as exc:
        raise ProbeUnavailable(f"the jcmd on PATH is not safe to run: {exc}; {JCMD_HOWTO}") from None
    if found is None:
        raise ProbeUnavailable(f"no jcmd found for the JVM {pid}: {JCMD_HOWTO}")
    return found


def _sibling_jcmd(pid: int, root: Path) -> str | None:
    """The jcmd beside the target's `java` (same version), when the target shares medic's mount namespace
    (a path read from a container's exe names a file of the container, not of the host)."""
    try:
        own_namespace = os.readlink(proc_path(root, "self", "ns", "mnt"))
        if os.readlink(proc_path(root, pid, "ns", "mnt")) != own_namespace:
            return None
        sibling = os.path.join(os.path.dirname(os.readlink(proc_path(root, pid, "exe"))), "jcmd")
    except OSError:
        return None
    return sibling if os.path.lexists(sibling) else None
