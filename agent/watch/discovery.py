"""Find the process behind each configured instance: by pid, pidfile or command-line regex.

Returns process identities only; deciding what is a restart is the tracker's job.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil

from agent.core.errors import ProbeError, UnsafePath
from agent.core.records import ProcessIdentity
from probes.linux.fstrust import open_regular_file
from probes.linux.procfs import read_stat, start_time

MAX_PIDFILE_BYTES = 4096  # a pid and a newline; a pidfile this long is something else


def by_pid(pid: int) -> ProcessIdentity | None:
    """The identity of a running process; None if it is gone or a zombie (exited, not yet reaped)."""
    try:
        stat = read_stat(pid)
    except ProbeError:
        return None
    if stat.state in ("Z", "X"):
        return None
    return ProcessIdentity(pid, start_time(stat))


def by_pidfile(path: Path) -> tuple[ProcessIdentity | None, str | None]:
    """The identity of the pid written in `path`, or None with the reason why not.

    The target may write its pidfile, so the file is opened as one it controls: a symlink there is
    not followed (it could point at a root-only file whose first line would then be shown as "not a
    pid"), and a FIFO, device or file over `MAX_PIDFILE_BYTES` is refused before it can block or
    flood the tracker."""
    try:
        with open_regular_file(path, MAX_PIDFILE_BYTES) as handle:
            text = handle.read(MAX_PIDFILE_BYTES).decode("ascii", errors="replace").strip()
    except FileNotFoundError:
        return None, f"pidfile {path} does not exist (yet)"
    except UnsafePath as exc:
        return None, f"pidfile refused: {exc}"
    except OSError as exc:
        return None, f"cannot read pidfile {path}: {exc.strerror}"
    if not text.isdigit() or int(text) <= 0:
        return None, f"pidfile {path} does not hold a pid: {text[:40]!r}"
    identity = by_pid(int(text))
    if identity is None:
        return None, f"pidfile {path} names pid {text}, which is not running"
    return identity, None


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
