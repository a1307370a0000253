"""`medic doctor`'s diagnosis of one process: which allocator serves it, whether a hook answers, and
what to add (LD_PRELOAD, MALLOC_CONF, MEDIC_HOOK_SOCKET, PYTHONMALLOC) to see more. When the hook of
a Python process does not answer, `native_hooks.delivery` says exactly what it lacks (`missing`).

The hook's own answer is the truth about the allocator when it is reachable (it asks `dladdr` from
inside); otherwise the outside view of `native_hooks.which_allocator` is used. Each piece of advice is one
sentence that names the exact setting.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.core.errors import ProbeError
from agent.core.figures import is_figure
from agent.core.units import format_bytes
from native_hooks.delivery import python_hook_gaps
from native_hooks.errors import ShimNotBuilt
from native_hooks.sockets import find_socket
from native_hooks.which_allocator import AllocatorGuess, detect_allocator
from probes.linux.procfs import HOST_ROOT, proc_path

AUTOSTART_HINT = (
    "MEDIC_HOOK_SOCKET=auto plus `medic hook install-pth` once per environment (a .pth line that "
    "starts medic_hook), or `import medic_hook; medic_hook.start()` in the program"
)


@dataclass(slots=True)
class HookStatus:
    socket: str | None = None
    reachable: bool = False
    kind: str | None = None  # "python" or "shim"
    error: str | None = None
    allocator: str | None = None
    figures: dict[str, int | float] = field(default_factory=dict)
    prof: dict[str, bool] = field(default_factory=dict)
    python: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class DoctorReport:
    pid: int
    allocator: str
    detected: AllocatorGuess | None
    hook: HookStatus
    advice: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # what keeps a Python process's hook from answering

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "allocator": self.allocator,
            "detected": self.detected.to_dict() if self.detected else None,
            "hook": {
                "socket": self.hook.socket,
                "reachable": self.hook.reachable,
                "kind": self.hook.kind,
                "error": self.hook.error,
                "allocator": self.hook.allocator,
                "figures": self.hook.figures,
                "prof": self.hook.prof,
                "python": self.hook.python,
            },
            "missing": self.missing,
            "advice": self.advice,
            "problems": self.problems,
        }


def _shim() -> str:
    try:
        from native_hooks.shim import shim_path

        return shim_path()
    except ShimNotBuilt:
        return "$(medic hook path)"


def _probe_hook(socket: str | None, timeout: float, pid: int, root: Path) -> HookStatus:
    from native_hooks.client import HookClient

    status = HookStatus(socket=socket)
    if socket is None:
        status.error = "no hook socket found"
        return status
    try:
        with HookClient(socket, timeout, pid=pid, root=root) as client:  # only pid's own listener
            stats = client.request("stats")
    except ProbeError as exc:
        status.error = str(exc)
        return status
    status.reachable = True
    # the reply comes from the target's process: keep what has the shape the report reads
    status.kind = _text(stats.get("hook"))
    status.allocator = _text(stats.get("allocator"))
    figures, prof, python = (_object(stats.get(k)) for k in ("figures", "prof", "python"))
    status.figures = {str(k)[:50]: v for k, v in figures.items() if is_figure(v)}
    status.prof = {str(k)[:50]: v for k, v in prof.items() if isinstance(v, bool)}
    status.python = python
    return status


def _object(value: object) -> dict[str, Any]:
    """A JSON object of the reply, or an empty one when the target sent something else."""
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str | None:
    return value[:100] if isinstance(value, str) else None


def diagnose(
    pid: int, socket: str | None = None, timeout: float = 2.0, root: Path = HOST_ROOT
) -> DoctorReport:
    """Diagnose `pid`; never raises for what it can report (a vanished pid raises `TargetGone`)."""
    problems: list[str] = []
    try:
        detected: AllocatorGuess | None = detect_allocator(pid, root)
    except ProbeError as exc:
        if not os.path.exists(proc_path(root, pid)):
            raise
        detected, problems = None, [f"outside detection failed: {exc}"]
    hook = _probe_hook(socket or find_socket(pid, root), timeout, pid, root)
    allocator = hook.allocator or (detected.allocator if detected else "unknown")
    report = DoctorReport(pid=pid, allocator=allocator, detected=detected, hook=hook, problems=problems)
    shimmed = detected is not None and any("medic_shim" in os.path.basename(p) for p in detected.preload)
    if not hook.reachable and detected is not None and detected.is_python and not shimmed:
        report.missing = python_hook_gaps(pid, socket, root)  # the in-process hook: what it lacks
    report.advice = advise(report)
    return report


def advise(report: DoctorReport) -> list[str]:
    """What to add to see more, most important first."""
    detected, hook = report.detected, report.hook
    env = detected.env if detected else {}
    is_python = bool(detected and detected.is_python) or hook.kind == "python"
    advice: list[str] = []
    if not hook.reachable:
        if hook.socket and "nothing listens" in (hook.error or ""):
            advice.append(
                f"{hook.socket} is stale (its process exited or exec'd): `medic hook clean` removes it"
            )
        if env.get("MEDIC_HOOK_SOCKET") and not report.missing:
            advice.append(
                f"MEDIC_HOOK_SOCKET={env['MEDIC_HOOK_SOCKET']} is set but no hook answers: check that the shim is "
                "in LD_PRELOAD (or the autostart imported) and set MEDIC_HOOK_DEBUG=1 to see why it did not start"
            )
        preload = ":".join([*(detected.preload if detected else []), _shim()])
        if report.missing:
            advice.append(
                f"instead of the in-process hook, the shim gives allocator figures (but no type histogram): "
                f"LD_PRELOAD={preload} MEDIC_HOOK_SOCKET=auto"
            )
        elif is_python:
            advice.append(
                f"restart it with the in-process hook ({AUTOSTART_HINT}); it also answers `histogram`. "
                f"The shim works too: LD_PRELOAD={preload} MEDIC_HOOK_SOCKET=auto"
            )
        else:
            advice.append(
                f"restart it with LD_PRELOAD={preload} MEDIC_HOOK_SOCKET=auto to get allocator figures"
            )
    if detected and detected.static and not detected.stats_exported:
        advice.append(
            f"malloc is a statically linked {detected.allocator} that does not export its statistics API: "
            "link with -rdynamic (jemalloc: mallctl), or use heap-profile files "
            "(MALLOC_CONF=prof:true,lg_prof_interval:30,prof_prefix:/dir/prefix)"
        )
    if report.allocator == "glibc":
        advice.append(
            "glibc malloc returns fragmented memory poorly and has no heap profiler: consider "
            "LD_PRELOAD=libjemalloc.so.2 (Debian package libjemalloc2), which medic can purge and profile"
        )
    if report.allocator == "jemalloc":
        prof_on = hook.prof.get("enabled") if hook.reachable else "prof:true" in env.get("MALLOC_CONF", "")
        if not prof_on:
            advice.append(
                "add MALLOC_CONF=prof:true,prof_active:false at start for heap profiles (leak suspects); "
                "sampling costs nothing until medic switches it on"
            )
    if report.allocator == "tcmalloc":
        no_profiler = (hook.reachable and not hook.prof.get("enabled")) or (
            detected is not None and not hook.reachable and not detected.heap_profiler
        )
        if no_profiler:
            advice.append(
                "libtcmalloc_minimal has no heap profiler: preload libtcmalloc.so.4 "
                "(Debian package libgoogle-perftools4) for heap profiles"
            )
    pymalloc_on = hook.python.get("pymalloc") if hook.python else env.get("PYTHONMALLOC") != "malloc"
    if is_python and pymalloc_on:
        advice.append(
            "Python objects of 512 bytes or less live in pymalloc arenas that the allocator does not see: "
            "PYTHONMALLOC=malloc makes them visible (costs some speed)"
        )
    return advice


def render(report: DoctorReport) -> str:
    """The report for people: a few aligned lines, then the advice."""
    detected, hook = report.detected, report.hook
    lines = [f"pid            {report.pid}"]
    if detected:
        where = detected.object_path + (" (static)" if detected.static else "")
        lines.append(f"allocator      {report.allocator}  ({where or 'unknown object'})")
        for item in detected.evidence:
            lines.append(f"               - {item}")
        if detected.env:
            lines.append("environment    " + " ".join(f"{k}={v}" for k, v in sorted(detected.env.items())))
    else:
        lines.append(f"allocator      {report.allocator}")
    if hook.reachable:
        lines.append(f"hook           {hook.socket} ({hook.kind}, answers)")
        shown = ("allocated", "active", "resident", "mapped", "retained", "purgeable")
        lines.append(
            "figures        "
            + "  ".join(
                f"{name} {format_bytes(hook.figures[name])}" for name in shown if name in hook.figures
            )
        )
        if hook.prof:
            lines.append(
                f"heap profiles  enabled={hook.prof.get('enabled')} active={hook.prof.get('active')}"
            )
    else:
        lines.append(f"hook           none reachable ({hook.error})")
    for problem in report.problems:
        lines.append(f"problem        {problem}")
    if report.missing:
        lines.append("missing:")
        lines += [f"  - {item}" for item in report.missing]
    if report.advice:
        lines.append("to see more:")
        lines += [f"  - {item}" for item in report.advice]
    else:
        lines.append("nothing to add: medic sees this process's allocator fully")
    return "\n".join(lines)
