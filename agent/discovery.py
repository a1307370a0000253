"""Find the process behind each configured instance: by pid, pidfile or command-line regex.

Returns process identities only; deciding what is a restart is the tracker's job.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil

from agent.errors import ProbeError, TargetGone
from agent.records import ProcessIdentity
from probes.linux.procfs import process_identity


def by_pid(pid: int) -> ProcessIdentity | None:
    try:
        return process_identity(pid)
    except ProbeError:
        return None


def by_pidfile(path: Path) -> tuple[ProcessIdentity | None, str | None]:
    """The identity of the pid written in `path`, or None with the reason why not."""
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return None, f"pidfile {path} does not exist (yet)"
    except OSError as exc:
        return None, f"cannot read pidfile {path}: {exc.strerror}"
    if not text.isdigit() or int(text) <= 0:
        return None, f"pidfile {path} does not hold a pid: {text[:40]!r}"
    try:
        return process_identity(int(text)), None
    except TargetGone:
        return None, f"pidfile {path} names pid {text}, which is not running"
    except ProbeError as exc:
        return None, str(exc)


def by_cmdline(pattern: str) -> list[ProcessIdentity]:
    """Every process whose command line matches `pattern`, oldest first; medic and its ancestors excluded."""
    regex = re.compile(pattern)
    excluded = _self_and_ancestors()
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid in excluded:
            continue
        cmdline = proc.info.get("cmdline")
        if not cmdline or not regex.search(" ".join(cmdline)):
            continue
        identity = by_pid(proc.pid)
        if identity is not None:
            found.append(identity)
    found.sort(key=lambda ident: (ident.start_time, ident.pid))
    return found


def _self_and_ancestors() -> set[int]:
    pids = {os.getpid()}
    try:
        for parent in psutil.Process().parents():
            pids.add(parent.pid)
    except psutil.Error:
        pass
    return pids
