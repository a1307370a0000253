"""One agent per state directory: `state_dir/lock`, held with `flock` for the agent's whole life.

Two agents on one state_dir would adopt each other's children as "launched by an earlier medic",
judge and restart the same instances, and the one that stops first would stop the other's workloads
and remove the `agent.json` the CLI finds the survivor by. The kernel drops the lock when its holder
exits, however it exits, so a killed agent never leaves a stale lock behind; the descriptor is
close-on-exec, so a managed child that outlives its agent does not keep it either.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from agent.core.errors import ConfigError, MedicError
from agent.state import AGENT_FILE_NAME
from probes.linux.fstrust import ensure_private_file, read_private_file

LOCK_FILE_NAME = "lock"


class StateDirLock:
    """The held lock; `release()` (or the holder's exit) frees the state directory."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None

    def __enter__(self) -> StateDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def hold_state_dir(state_dir: str | os.PathLike[str]) -> StateDirLock:
    """Take `state_dir`'s lock or refuse (`ConfigError`, naming the agent that holds it).

    `state_dir` must already be a private directory (`ensure_private_dir`); the lock file is checked
    like every state file (a regular file of ours, never a symlink).
    """
    directory = Path(state_dir)
    path = ensure_private_file(directory / LOCK_FILE_NAME, "agent.state_dir lock")
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"agent.state_dir {directory} is in use by another medic{_holder(directory)}: two agents on "
            "one state directory would restart the same instances; stop that agent, or give this one "
            "its own agent.state_dir"
        ) from None
    except OSError as exc:
        os.close(fd)
        raise ConfigError(
            f"agent.state_dir {directory}: cannot lock {path} ({exc.strerror or exc}); keep the state "
            "directory on a local filesystem"
        ) from None
    record = json.dumps({"pid": os.getpid(), "since": time.time()}).encode() + b"\n"
    with contextlib.suppress(OSError):  # who holds it is a courtesy for the next one's message
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
    return StateDirLock(path, fd)


def _holder(directory: Path) -> str:
    """' (pid N, API URL)' from what the holder wrote, or '' when it cannot be told."""
    pid = _read_json(directory / LOCK_FILE_NAME).get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        return ""
    agent = _read_json(directory / AGENT_FILE_NAME)
    url = agent.get("url") if agent.get("pid") == pid else None
    return f" (pid {pid}, API {url})" if isinstance(url, str) else f" (pid {pid})"


def _read_json(path: Path) -> dict[str, object]:
    try:
        value = json.loads(read_private_file(path, path.name, max_bytes=4096))
    except (OSError, ValueError, MedicError):  # absent, unsafe or garbage: nothing to say about it
        return {}
    return value if isinstance(value, dict) else {}
