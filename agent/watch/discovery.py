"""Find the process behind each configured instance: by pid, pidfile or command-line regex.

Returns process identities only; deciding what is a restart is the tracker's job.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agent.core.errors import ProbeError, UnsafePath
from agent.core.patterns import compile_pattern
from agent.core.records import ProcessIdentity
from probes.linux.fstrust import check_trusted_path, open_regular_file, trusted_uids
from probes.linux.procfs import read_stat, start_time
from probes.linux.procstatus import read_status

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
    flood the tracker. Whoever can write the pidfile chooses what medic signals and restarts, so
    it must be writable by its owner alone, in a directory of root, medic's user or that owner that
    others cannot write (or only with the sticky bit, as /run/lock: they cannot replace a file they do
    not own), under directories only those may change; and owned by root or medic's user, or else by
    the uid the named process runs as (a user's pidfile can only point medic at that user's processes)."""
    try:
        with open_regular_file(path, MAX_PIDFILE_BYTES) as handle:
            info = os.fstat(handle.fileno())
            text = handle.read(MAX_PIDFILE_BYTES).decode("ascii", errors="replace").strip()
    except FileNotFoundError:
        return None, f"pidfile {path} does not exist (yet)"
    except UnsafePath as exc:
        return None, f"pidfile refused: {exc}"
    except OSError as exc:
        return None, f"cannot read pidfile {path}: {exc.strerror}"
    problem = _untrusted_pidfile(path, info)
    if problem:
        return None, f"pidfile refused: {problem}"
    if not text.isdigit() or int(text) <= 0:
        return None, f"pidfile {path} does not hold a pid: {text[:40]!r}"
    identity = by_pid(int(text))
    if identity is None:
        return None, f"pidfile {path} names pid {text}, which is not running"
    if info.st_uid not in trusted_uids():
        try:
            runs_as = read_status(identity.pid).real_uid
        except ProbeError:
            return None, f"pidfile {path} names pid {text}, which is not running"
        if runs_as != info.st_uid:
            return None, (
                f"pidfile refused: {path} belongs to uid {info.st_uid} but names pid {text}, which runs as "
                f"uid {runs_as}: a pidfile not owned by root or medic's user may only name its owner's "
                f"processes; have the service write it as uid {runs_as} or `chown root {path}`"
            )
    return identity, None


def _untrusted_pidfile(path: Path, info: os.stat_result) -> str | None:
    """Why another user could rewrite the pidfile (group/other write, or a directory they control)."""
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {mode:04o}): run `chmod go-w {path}`"
    owners = trusted_uids() | {info.st_uid}
    try:
        directory = Path(os.path.realpath(path.parent, strict=True))
        folder = os.stat(directory)
        check_trusted_path(directory.parent, owners=owners)
    except (OSError, UnsafePath) as exc:
        return f"{path}: its directory is not safe: {exc}"
    if folder.st_uid not in owners:
        return (
            f"{path}: its directory {directory} belongs to uid {folder.st_uid}, who could replace the pidfile"
        )
    if folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not folder.st_mode & stat.S_ISVTX:
        return (
            f"{path}: its directory {directory} is writable by group or others without the sticky bit "
            f"(mode {stat.S_IMODE(folder.st_mode):04o}): run `chmod go-w {directory}` or `chmod +t {directory}`"
        )
    return None


def by_cmdline(pattern: str) -> list[ProcessIdentity]:
    """Every process whose command line matches `pattern`, oldest first; medic and its ancestors excluded."""
    # loaded by the first `match.cmdline` only: 1.3 MiB of objects a pid or pidfile never needs; psutil
    # ships no types, and its stubs (types-psutil) are not in the lint extra
    import psutil  # type: ignore[import-untyped]

    regex = compile_pattern(pattern)  # linear in the text: any user can write a 700 KB command line
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
    import psutil

    pids = {os.getpid()}
    try:
        for parent in psutil.Process().parents():
            pids.add(parent.pid)
    except psutil.Error:
        pass
    return pids
