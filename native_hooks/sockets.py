"""Where hook sockets live, how a target binds one safely, and how medic finds and cleans them.

`MEDIC_HOOK_SOCKET` in the target's environment names the socket: `%p` becomes the pid (so a child
that inherits the variable binds its own socket), `%%` a literal `%`, and the value `auto` means
the conventional path `<dir>/hook.<pid>.sock`, where `<dir>` is the first of

1. `$MEDIC_HOOK_DIR`,
2. `/run/medic` when the process runs as root,
3. `$XDG_RUNTIME_DIR/medic`,
4. `/tmp/medic-<uid>`.

The C shim applies the same rules (`shim.c`). medic finds a target's socket by reading the target's
environment (`/proc/PID/environ`), falling back to the conventional directories for its uid, and
removes sockets whose process is gone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import stat
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

ENV_SOCKET = "MEDIC_HOOK_SOCKET"
ENV_DIR = "MEDIC_HOOK_DIR"
AUTO = "auto"
SOCKET_NAME = re.compile(r"^hook\.(\d+)\.sock$")
MAX_PATH_BYTES = 107  # sun_path holds 108 bytes including the terminating NUL
STALE_GRACE_SECONDS = 10.0  # a socket younger than this may be between bind() and listen()


class SocketPathError(ValueError):
    """A socket template that cannot be used; the message says why."""


def default_dir(uid: int, env: Mapping[str, str]) -> str:
    """The conventional socket directory for a process with this uid and environment."""
    if env.get(ENV_DIR):
        return env[ENV_DIR]
    if uid == 0:
        return "/run/medic"
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "medic")
    return f"/tmp/medic-{uid}"


def socket_name(pid: int) -> str:
    return f"hook.{pid}.sock"


def expand(template: str, pid: int, uid: int, env: Mapping[str, str]) -> str:
    """The socket path a process with `pid`, `uid` and `env` binds for `template`; raises `SocketPathError`."""
    if not template.strip():
        raise SocketPathError(
            f"{ENV_SOCKET} is empty: set it to 'auto' or to a socket path such as /run/medic/x.%p.sock"
        )
    if template.strip() == AUTO:
        path = os.path.join(default_dir(uid, env), socket_name(pid))
    else:
        path = re.sub(r"%[p%]", lambda m: str(pid) if m.group(0) == "%p" else "%", template)
    if not path.startswith("/"):
        raise SocketPathError(f"hook socket path must be absolute, got {path!r}")
    if "\x00" in path:
        raise SocketPathError("hook socket path must not contain NUL characters")
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise SocketPathError(
            f"hook socket path {path!r} is longer than {MAX_PATH_BYTES} bytes (the Unix socket limit): "
            "choose a shorter directory"
        )
    return path


def has_pid(template: str) -> bool:
    """True when each process gets its own path (`auto` or a `%p` template)."""
    return template.strip() == AUTO or "%p" in template.replace("%%", "")


# -- target side -------------------------------------------------------------------------------------
def ensure_private_dir(directory: str) -> None:
    """Create `directory` (mode 0700) if missing; refuse one owned by someone else or open to others."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise SocketPathError(f"{directory} exists but is not a directory")
    if info.st_uid not in (os.geteuid(), 0):
        raise SocketPathError(
            f"{directory} belongs to uid {info.st_uid}, not to us: refusing to put a socket there"
        )


def is_live(path: str, timeout: float = 0.5) -> bool:
    """True when something accepts connections on `path` (any error but 'refused'/'missing' counts as live)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True


def bind_listener(path: str, backlog: int = 16) -> socket.socket:
    """A listening socket at `path` with mode 0600, bound without touching the process umask.

    The socket is bound in a private temporary directory and renamed into place, so it is never
    reachable with looser permissions. A stale socket is replaced; a live one raises `FileExistsError`;
    a non-socket file at `path` raises `SocketPathError`.
    """
    directory = os.path.dirname(path)
    ensure_private_dir(directory)
    with contextlib.suppress(FileNotFoundError):
        info = os.lstat(path)
        if not stat.S_ISSOCK(info.st_mode):
            raise SocketPathError(f"{path} exists and is not a socket: refusing to replace it")
        if is_live(path):
            raise FileExistsError(errno.EADDRINUSE, f"another process serves {path}", path)
    staging = tempfile.mkdtemp(prefix=".medic-", dir=directory)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        staged = os.path.join(staging, "s")
        listener.bind(staged)
        os.chmod(staged, 0o600)
        listener.listen(backlog)
        os.rename(staged, path)
    except BaseException:
        listener.close()
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(staging, "s"))
        with contextlib.suppress(OSError):
            os.rmdir(staging)
    return listener


# -- medic side ----------------------------------------------------------------------------------
def parse_environ(data: bytes) -> dict[str, str]:
    """`/proc/PID/environ` (NUL-separated `KEY=VALUE`) as a dict; entries without `=` are skipped."""
    env: dict[str, str] = {}
    for entry in data.split(b"\x00"):
        key, sep, value = entry.partition(b"=")
        if sep and key:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def _read_environ(pid: int, proc: str) -> dict[str, str]:
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            return parse_environ(f.read())
    except OSError:
        return {}


def _status_ids(pid: int, proc: str) -> tuple[int | None, int]:
    """(real uid, innermost namespace pid) of a process; uid None when it cannot be read."""
    uid, ns_pid = None, pid
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    uid = int(line.split()[1])
                elif line.startswith(b"NSpid:"):
                    ns_pid = int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return uid, ns_pid


def namespace_pids(pid: int, proc: str = "/proc") -> set[int]:
    """Every pid the process has, from the host's down to its innermost pid namespace (NSpid)."""
    pids = {pid}
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    pids.update(int(value) for value in line.split()[1:])
    except (OSError, ValueError):
        pass
    return pids


def candidate_paths(pid: int, proc: str = "/proc", env: Mapping[str, str] | None = None) -> list[str]:
    """Paths where the hook socket of `pid` may be, most specific first (no existence check).

    The target's own `MEDIC_HOOK_SOCKET` comes first; then the conventional directories for its uid
    as the target and as medic would compute them. Paths inside another mount namespace are also
    tried through `/proc/PID/root`.
    """
    env = os.environ if env is None else env
    uid, ns_pid = _status_ids(pid, proc)
    target_env = _read_environ(pid, proc)
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
        paths += [f"{proc}/{pid}/root{path}" for path in list(paths)]
    return list(dict.fromkeys(paths))


def find_socket(pid: int, proc: str = "/proc", env: Mapping[str, str] | None = None) -> str | None:
    """The first existing socket among `candidate_paths(pid)`, or None."""
    for path in candidate_paths(pid, proc, env):
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.stat(path).st_mode):
                return path
    return None


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
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            match = SOCKET_NAME.match(name)
            if not match:
                continue
            path = os.path.join(directory, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISSOCK(info.st_mode) or is_live(path):
                continue
            if _pid_alive(int(match.group(1))) and now - info.st_mtime < STALE_GRACE_SECONDS:
                continue  # possibly between bind() and listen()
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
    return removed
