"""Which files and directories medic may trust, and how it writes its own.

medic often runs as root beside a target that runs as somebody else. A path that a less privileged
user can change (owns, or can write to through a group/other write bit, anywhere from `/` down) is
not trusted: medic neither executes a program found there nor keeps its state, tokens or sockets
there. The rules are those of ssh and sudo:

- every component of the path (after resolving symlinks) is owned by root or by medic's own user;
- no component is writable by group or others, except a directory with the sticky bit (`/tmp`)
  that is owned by root, which is crossed but never trusted as the final directory;
- private directories (state, sockets, evidence) are 0700, not symlinks, owned by medic's user;
- files medic writes are created with `O_NOFOLLOW | O_EXCL` under a fresh name and renamed into
  place, so a planted symlink never redirects a write;
- files a target writes (heap-profile dumps) are opened with `O_NOFOLLOW` and checked for owner.

Every refusal is an `UnsafePath` whose message says what is wrong and the command that fixes it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import IO

from agent.core.errors import UnsafePath

__all__ = [
    "UnsafePath",
    "atomic_file",
    "atomic_write",
    "check_trusted_path",
    "create_exclusive",
    "ensure_private_dir",
    "ensure_private_file",
    "open_owned_file",
    "open_regular_file",
    "read_private_file",
    "trusted_program",
    "trusted_uids",
]


# a file medic creates: new (never an existing one), and never through a symlink
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def trusted_uids() -> frozenset[int]:
    """Root and the user medic runs as: the only owners of what medic executes or keeps."""
    return frozenset({0, os.geteuid()})


def _mode_problem(path: str, info: os.stat_result, final: bool) -> str | None:
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if not writable:
        return None
    sticky_root_dir = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX and info.st_uid == 0
    if sticky_root_dir and not final:
        return None
    return f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}): run `chmod go-w {path}`"


def check_trusted_path(path: str | os.PathLike[str], owners: Collection[int] | None = None) -> Path:
    """The resolved `path` when it and every directory above it are safe to trust; else `UnsafePath`.

    `owners` are the uids allowed to own each component (default: root and medic's user).
    """
    allowed = frozenset(owners) if owners is not None else trusted_uids()
    try:
        resolved = Path(os.path.realpath(os.fspath(path), strict=True))
    except (OSError, RuntimeError) as exc:
        raise UnsafePath(f"{path}: cannot resolve it ({exc})") from None
    parts = [resolved, *resolved.parents]
    for index, component in enumerate(parts):
        try:
            info = os.lstat(component)
        except OSError as exc:
            raise UnsafePath(f"{component}: cannot inspect it ({exc.strerror or exc})") from None
        if info.st_uid not in allowed:
            raise UnsafePath(
                f"{component} belongs to uid {info.st_uid}, who could replace what medic trusts there: "
                f"use a path owned by root or by uid {os.geteuid()} (`chown root {component}`)"
            )
        problem = _mode_problem(str(component), info, final=index == 0)
        if problem:
            raise UnsafePath(problem)
    return resolved


def ensure_private_dir(directory: str | os.PathLike[str], what: str = "directory") -> Path:
    """Create `directory` 0700 if missing; refuse a symlink, a non-directory, another owner, or one
    others can write. One of ours that others can only read is tightened to 0700.

    The parent chain must be trustworthy too (no other user can rename the directory away; a
    root-owned sticky parent such as /tmp is fine).
    """
    path = Path(directory)
    with contextlib.suppress(FileExistsError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.mkdir(path, 0o700)
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise UnsafePath(f"{what} {path}: cannot inspect it ({exc.strerror or exc})") from None
    _check_private(path, info, what, directory=True, owners=frozenset({os.geteuid()}), mode=0o700)
    check_trusted_path(path, owners=trusted_uids())
    return path


def _check_private(
    path: Path, info: os.stat_result, what: str, *, directory: bool, owners: frozenset[int], mode: int
) -> None:
    """What a private directory or file passes: not a symlink, of its type, owned by one of `owners`,
    not writable by others. One that others can only read is ours, so tightened to `mode` rather
    than refused."""
    if stat.S_ISLNK(info.st_mode):
        fix = (
            "point the setting at the real directory"
            if directory
            else f"remove it (`rm {path}`) or point the setting at the real file"
        )
        raise UnsafePath(
            f"{what} {path} is a symlink (to {os.readlink(path)}): medic does not follow it; {fix}"
        )
    if directory and not stat.S_ISDIR(info.st_mode):
        raise UnsafePath(f"{what} {path} exists but is not a directory")
    if not directory and not stat.S_ISREG(info.st_mode):
        raise UnsafePath(f"{what} {path} exists but is not a regular file: remove it or choose another path")
    if info.st_uid not in owners:
        fix = "or choose another directory" if directory else "after checking its contents"
        raise UnsafePath(
            f"{what} {path} belongs to uid {info.st_uid}, not to medic's uid {os.geteuid()}: "
            f"run `chown {os.geteuid()} {path}` {fix}"
        )
    current = stat.S_IMODE(info.st_mode)
    if current & 0o022:
        risk = "anyone could plant files there; " if directory else ""
        raise UnsafePath(
            f"{what} {path} is writable by other users (mode {current:04o}): {risk}"
            f"run `chmod {mode:o} {path}` after checking its contents"
        )
    if current & 0o077 & ~mode:
        os.chmod(path, mode, follow_symlinks=False)


def _fresh_temp(directory: Path, name: str, mode: int) -> tuple[int, Path]:
    """A new file beside `name`, under a random name no link can have been planted at."""
    tmp = directory / f".{name}.{secrets.token_hex(6)}.tmp"
    return os.open(tmp, _CREATE_FLAGS, mode), tmp


@contextlib.contextmanager
def _exclusive_temp(directory: Path, name: str, mode: int) -> Iterator[tuple[int, Path]]:
    fd, tmp = _fresh_temp(directory, name, mode)
    try:
        yield fd, tmp
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write(path: str | os.PathLike[str], data: bytes, mode: int = 0o600, fsync: bool = True) -> None:
    """Write `data` to `path` through a fresh `O_EXCL | O_NOFOLLOW` file renamed into place.

    A symlink planted at the temporary or the final name is never followed: rename replaces the
    link itself. Raises `OSError` (ENOSPC on a full disk) with the target left as it was.
    """
    target = Path(path)
    with _exclusive_temp(target.parent, target.name, mode) as (fd, tmp):
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if fsync:
            os.fsync(fd)
        os.close(fd)
        os.replace(tmp, target)


def _open_unfollowed(path: str | os.PathLike[str], on_link: str) -> int:
    """A read-only descriptor on `path` that never blocks on a FIFO; a symlink as the last component
    raises `UnsafePath(on_link)`."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(on_link) from None
        raise


def open_owned_file(
    path: str | os.PathLike[str], owners: Collection[int], max_bytes: int | None = None
) -> bytes:
    """Read a file another process wrote: no symlink followed, a regular file owned by one of `owners`.

    Used for files a target produces (heap-profile dumps); `max_bytes` bounds what is read.
    """
    fd = _open_unfollowed(path, f"{path} is a symlink: medic does not follow links a target controls")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePath(f"{path} is not a regular file")
        if info.st_uid not in owners:
            raise UnsafePath(f"{path} belongs to uid {info.st_uid}, not to the target or medic: not read")
        if max_bytes is not None and info.st_size > max_bytes:
            raise UnsafePath(f"{path} is {info.st_size} bytes, over the {max_bytes}-byte limit: not read")
        chunks = []
        remaining = max_bytes if max_bytes is not None else -1
        while True:
            chunk = os.read(fd, 1 << 20 if remaining < 0 else min(1 << 20, remaining + 1))
            if not chunk:
                break
            chunks.append(chunk)
            if remaining >= 0:
                remaining -= len(chunk)
                if remaining < 0:
                    raise UnsafePath(f"{path} grew past the {max_bytes}-byte limit while read: not read")
        return b"".join(chunks)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: int = 0o600, fsync: bool = True) -> Iterator[IO[bytes]]:
    """`atomic_write` for data written in pieces: a binary file under a fresh `O_EXCL | O_NOFOLLOW`
    name, renamed to `path` when the block ends without error (and removed when it raises)."""
    target = Path(path)
    fd, tmp = _fresh_temp(target.parent, target.name, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            if fsync:
                os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def create_exclusive(path: str | os.PathLike[str], data: bytes, mode: int = 0o600) -> bool:
    """Create `path` holding `data` unless it exists (False then, left as it is).

    Written under a fresh `O_EXCL | O_NOFOLLOW` name and hard-linked into place, so the file appears
    whole or not at all, and a name that exists (file or planted symlink) is never replaced.
    """
    target = Path(path)
    fd, tmp = _fresh_temp(target.parent, target.name, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.link(tmp, target, follow_symlinks=False)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return True


def ensure_private_file(
    path: str | os.PathLike[str], what: str = "file", owners: Collection[int] | None = None, mode: int = 0o600
) -> Path:
    """Create `path` empty with `mode` (`O_EXCL | O_NOFOLLOW`) if missing, for a file others open by
    name afterwards (a database). One that exists must be a regular file, not a symlink, owned by
    one of `owners` (default: medic's user) and not writable by others; readable by others is
    tightened to `mode`."""
    target = Path(path)
    allowed = frozenset(owners) if owners is not None else frozenset({os.geteuid()})
    with contextlib.suppress(FileExistsError):
        os.close(os.open(target, _CREATE_FLAGS, mode))
    _check_private(target, os.lstat(target), what, directory=False, owners=allowed, mode=mode)
    return target


def read_private_file(
    path: str | os.PathLike[str], what: str, owners: Collection[int] | None = None, max_bytes: int = 65536
) -> bytes:
    """Read a secret (a token): no symlink followed, a regular file owned by one of `owners` (default:
    root and medic's user) that neither group nor others may read or write; else `UnsafePath` with the fix."""
    allowed = frozenset(owners) if owners is not None else trusted_uids()
    fd = _open_unfollowed(
        path, f"{what} {path} is a symlink: medic does not follow it; point the setting at the real file"
    )
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePath(f"{what} {path} is not a regular file")
        if info.st_uid not in allowed:
            owner = "root or uid " + str(os.geteuid()) if 0 in allowed else f"uid {os.geteuid()}"
            raise UnsafePath(
                f"{what} {path} belongs to uid {info.st_uid}, who could read or change it: it must belong "
                f"to {owner}; run `chown {os.geteuid()} {path}`"
            )
        current = stat.S_IMODE(info.st_mode)
        if current & 0o077:
            raise UnsafePath(
                f"{what} {path} is readable or writable by others (mode {current:04o}): run `chmod 600 {path}`"
            )
        if info.st_size > max_bytes:
            raise UnsafePath(f"{what} {path} is {info.st_size} bytes, over the {max_bytes}-byte limit")
        return os.read(fd, max_bytes)
    finally:
        os.close(fd)


def open_regular_file(path: str | os.PathLike[str], max_bytes: int | None = None) -> IO[bytes]:
    """A binary file object on `path` read without trusting it: the last component is not followed
    when it is a symlink, and a FIFO, device or directory is refused before anything blocks on it.

    Used for files medic only parses (ELF objects named by a target's maps, possibly through
    `/proc/PID/root`): reading them as root is harmless once they cannot redirect the open, hang it
    or be endless. `max_bytes` bounds the file's size.
    """
    fd = _open_unfollowed(path, f"{path} is a symlink: medic does not follow links a target controls")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePath(f"{path} is not a regular file: not read")
        if max_bytes is not None and info.st_size > max_bytes:
            raise UnsafePath(f"{path} is {info.st_size} bytes, over the {max_bytes}-byte limit: not read")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def trusted_program(program: str | os.PathLike[str]) -> Path | None:
    """The resolved path of a helper program medic may run: `program` itself when it holds a `/`,
    else the first one on PATH. None when there is none (or it is not executable); `UnsafePath` when
    it, or a directory above it, is one another user could change.

    Running the resolved path closes the race: every component of it is root's or medic's and
    writable by nobody else.
    """
    name = os.fspath(program)
    found = name if "/" in name else shutil.which(name)
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        return None
    return check_trusted_path(found)
