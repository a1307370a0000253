"""Where hook sockets live, how a target binds one safely, and how medic finds and cleans them.

`MEDIC_HOOK_SOCKET` in the target's environment names the socket: `%p` becomes the pid (so a child
that inherits the variable binds its own socket), `%%` a literal `%`, and the value `auto` means
the conventional path `<dir>/hook.<pid>.sock`, where `<dir>` is the first of

1. `$MEDIC_HOOK_DIR`,
2. `/run/medic` when the process runs as root,
3. `$XDG_RUNTIME_DIR/medic`,
4. `/tmp/medic-<uid>`.

These rules and the target's side (binding a socket safely) live in `medic_hook.paths`, part of the
package that runs inside Python targets; they are re-exported here. The C shim applies the same rules
(`shim.c`).
medic finds a target's socket by reading the target's environment (`/proc/PID/environ`), falling
back to the conventional directories for its uid, and removes sockets whose process is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from agent.core.errors import ProbeError
from medic_hook.errors import SocketPathError
from medic_hook.paths import (  # noqa: F401 - the path rules, re-exported for medic's side
    AUTO,
    ENV_DIR,
    ENV_SOCKET,
    MAX_PATH_BYTES,
    bind_listener,
    default_dir,
    expand,
    has_pid,
    is_live,
    socket_name,
)
from probes.linux.procfs import HOST_ROOT, proc_path, read_environ
from probes.linux.procstatus import read_nspid, read_status

SOCKET_NAME = re.compile(r"^hook\.(\d+)\.sock$")
STALE_GRACE_SECONDS = 10.0  # a socket younger than this may be between bind() and listen()


# -- medic side ----------------------------------------------------------------------------------
def _read_environ(pid: int, root: Path) -> dict[str, str]:
    try:
        return read_environ(pid, root)
    except ProbeError:
        return {}


def _status_ids(pid: int, root: Path) -> tuple[int | None, int]:
    """(real uid, innermost namespace pid) of a process; uid None when it cannot be read."""
    try:
        status = read_status(pid, root)
    except ProbeError:
        return None, pid
    return status.real_uid, status.ns_pids[-1] if status.ns_pids else pid


def namespace_pids(pid: int, root: Path = HOST_ROOT) -> set[int]:
    """Every pid the process has, from the host's down to its innermost pid namespace (NSpid)."""
    try:
        return {pid, *read_nspid(pid, root)}
    except ProbeError:
        return {pid}


def candidate_paths(pid: int, root: Path = HOST_ROOT, env: Mapping[str, str] | None = None) -> list[str]:
    """Paths where the hook socket of `pid` may be, most specific first (no existence check).

    The target's own `MEDIC_HOOK_SOCKET` comes first; then the conventional directories for its uid
    as the target and as medic would compute them. Paths inside another mount namespace are also
    tried through `/proc/PID/root`.
    """
    env = os.environ if env is None else env
    uid, ns_pid = _status_ids(pid, root)
    target_env = _read_environ(pid, root)
    paths: list[str] = []
    template = target_env.get(ENV_SOCKET)
    if template and uid is not None:
        with contextlib.suppress(SocketPathError):
            paths.append(expand(template, ns_pid, uid, target_env))
    uids = [uid] if uid is not None else [os.getuid()]
    for who in uids:
        for directory in (
            default_dir(who, target_env),
            default_dir(who, env),
            "/run/medic",
            f"/run/user/{who}/medic",
            f"/tmp/medic-{who}",
        ):
            paths.append(os.path.join(directory, socket_name(ns_pid)))
    if ns_pid != pid:
        paths += [proc_path(root, pid, "root") + path for path in list(paths)]
    return list(dict.fromkeys(paths))


def find_socket(pid: int, root: Path = HOST_ROOT, env: Mapping[str, str] | None = None) -> str | None:
    """The first existing socket among `candidate_paths(pid)` that the target's user (or root, or
    medic's user) created, or None.

    Candidates lie in directories others may write to (`/tmp/medic-UID`, a target's template), so a
    symlink or a socket another user bound there is skipped: the kernel sets a socket file's owner
    at bind() and nobody else can change it. `HookClient(path, pid=pid)` then checks the listener.
    """
    owners = _socket_owners(pid, root)
    for path in candidate_paths(pid, root, env):
        with contextlib.suppress(OSError):
            info = os.lstat(path)
            if stat.S_ISSOCK(info.st_mode) and info.st_uid in owners:
                return path
    return None


def _socket_owners(pid: int, root: Path) -> set[int]:
    """Who may own the hook socket of `pid`: its uids (real, effective, saved, fs), root and medic."""
    owners = {0, os.geteuid()}
    with contextlib.suppress(ProbeError):
        owners.update(read_status(pid, root).uids)
    return owners


def conventional_dirs(env: Mapping[str, str] | None = None) -> list[str]:
    """Directories that may hold `hook.<pid>.sock` files of any user."""
    env = os.environ if env is None else env
    dirs = [env[ENV_DIR]] if env.get(ENV_DIR) else []
    dirs.append("/run/medic")
    dirs += [str(p) for p in Path("/run/user").glob("*/medic")]
    dirs += [str(p) for p in Path("/tmp").glob("medic-*")]
    return list(dict.fromkeys(dirs))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_sockets(dirs: Iterable[str] | None = None, now: float | None = None) -> list[str]:
    """Delete `hook.<pid>.sock` files nobody listens on and whose pid is gone (or that are older than
    `STALE_GRACE_SECONDS` and refuse connections); returns the removed paths."""
    now = time.time() if now is None else now
    removed = []
    for directory in conventional_dirs() if dirs is None else dirs:
        try:
            # unlink through the directory's descriptor: a directory swapped for a symlink meanwhile
            # cannot redirect a root medic's unlink elsewhere
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            removed += _remove_stale_in(directory, dir_fd, now)
        finally:
            os.close(dir_fd)
    return removed


def remove_if_stale(path: str, pid: int, now: float | None = None) -> bool:
    """Delete the hook socket `path` of a process `pid` the caller knows is gone, when nobody listens
    on it (a target stopped by a signal never ran its exit handlers); True when it was removed.

    The rule of `remove_stale_sockets`: a socket nobody listens on is stale when its pid is gone or
    it is older than `STALE_GRACE_SECONDS` (a zombie not reaped yet; a reused pid between bind() and
    listen() has a fresh one). Unlinked through its directory's descriptor, so a directory swapped
    for a symlink cannot redirect the unlink elsewhere; anything but a socket is left alone."""
    now = time.time() if now is None else now
    directory, name = os.path.split(path)
    try:
        dir_fd = os.open(directory or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        info = os.lstat(name, dir_fd=dir_fd)
        if not stat.S_ISSOCK(info.st_mode) or is_live(path):
            return False
        if _pid_alive(pid) and now - info.st_mtime < STALE_GRACE_SECONDS:
            return False
        os.unlink(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False
    finally:
        os.close(dir_fd)


def _remove_stale_in(directory: str, dir_fd: int, now: float) -> list[str]:
    removed: list[str] = []
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return removed
    for name in names:
        match = SOCKET_NAME.match(name)
        if not match:
            continue
        path = os.path.join(directory, name)
        try:
            info = os.lstat(name, dir_fd=dir_fd)
        except OSError:
            continue
        if not stat.S_ISSOCK(info.st_mode) or is_live(path):
            continue
        if _pid_alive(int(match.group(1))) and now - info.st_mtime < STALE_GRACE_SECONDS:
            continue  # possibly between bind() and listen()
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
            removed.append(path)
    return removed
