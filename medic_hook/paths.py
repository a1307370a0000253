"""Where the hook's socket goes and how it is bound without ever being reachable by others.

`MEDIC_HOOK_SOCKET` names the socket: `%p` becomes the pid (so a child that inherits the variable
binds its own socket), `%%` a literal `%`, and `auto` means `<dir>/hook.<pid>.sock`, where `<dir>` is
the first of $MEDIC_HOOK_DIR, /run/medic (as root), $XDG_RUNTIME_DIR/medic, /tmp/medic-<uid>.
The C shim (shim.c) applies the same rules; medic finds sockets with native_hooks.sockets.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import stat
from collections.abc import Mapping

from medic_hook.errors import SocketPathError

ENV_SOCKET = "MEDIC_HOOK_SOCKET"
ENV_DIR = "MEDIC_HOOK_DIR"
ENV_DEBUG = "MEDIC_HOOK_DEBUG"
AUTO = "auto"
MAX_PATH_BYTES = 107  # sun_path holds 108 bytes including the terminating NUL


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


def _socket_dir(directory: str) -> None:
    """Create `directory` (mode 0700) if missing; refuse a non-directory or one owned by someone else."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise SocketPathError(f"{directory} exists but is not a directory")
    if info.st_uid not in (os.geteuid(), 0):
        raise SocketPathError(
            f"{directory} belongs to uid {info.st_uid}, not to us: refusing to put a socket there"
        )


def bind_listener(path: str, backlog: int = 16) -> socket.socket:
    """A listening socket at `path` with mode 0600, bound without touching the process umask.

    The socket is bound in a private staging directory and renamed into place, so it is never
    reachable with looser permissions. A stale socket is replaced; a live one raises `FileExistsError`;
    a non-socket file at `path` raises `SocketPathError`.
    """
    directory = os.path.dirname(path)
    _socket_dir(directory)
    with contextlib.suppress(FileNotFoundError):
        info = os.lstat(path)
        if not stat.S_ISSOCK(info.st_mode):
            raise SocketPathError(f"{path} exists and is not a socket: refusing to replace it")
        if is_live(path):
            raise FileExistsError(errno.EADDRINUSE, f"another process serves {path}", path)
    staging = os.path.join(directory, f".medic-{os.getpid()}-{os.urandom(6).hex()}")
    os.mkdir(staging, 0o700)
    staged = os.path.join(staging, "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        listener.bind(staged)
        os.chmod(staged, 0o600)
        listener.listen(backlog)
        os.rename(staged, path)
    except BaseException:
        listener.close()
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        with contextlib.suppress(OSError):
            os.rmdir(staging)
    return listener
