"""A followed process's `/proc/PID` directory, held open for as long as medic follows the process.

Its files are opened relative to the directory (`openat`): no path to build or look up every tick,
and no way to reach another process: once the process has been reaped, every open and read through
the directory fails with ESRCH (`TargetGone`), even when a new process got the same pid. So the
identity (pid and start time) is checked once, when the directory is opened, and not again on each
read; a zombie still has its directory, and its `stat` says so.

Each held directory costs medic one file descriptor, so `ProcDirs` holds at most `hold_limit()` of
them (a quarter of the soft `RLIMIT_NOFILE`); past that a process's files are opened by path, with
the identity checked on every `stat` as `read_live_stat` does. `close` gives the descriptor back
when the process is no longer followed; it must not race a read, so `ProcDirs` serialises them.
Errors are translated at the edge as in `probes.linux.procfs`.
"""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

from agent.core.errors import TargetGone
from agent.core.records import ProcessIdentity
from probes.linux.procfs import (
    HOST_ROOT,
    ProcStat,
    ProcStatm,
    check_live,
    parse_stat,
    parse_statm,
    proc_path,
    read_piece,
    translate_os_error,
)
from probes.linux.procstatus import ProcStatus, parse_status

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
MAX_HELD = 1 << 16


def hold_limit() -> int:
    """How many /proc directories medic may hold open: a quarter of its soft limit on descriptors,
    leaving the rest to its database, sockets and the files the probes open."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_HELD if soft == resource.RLIM_INFINITY else max(0, min(MAX_HELD, soft // 4))


class ProcDir:
    """One process's /proc directory: held open (`hold`) or reached by path."""

    __slots__ = ("_base", "_dir", "_fd_size_counts", "identity", "root")

    def __init__(self, identity: ProcessIdentity, root: Path = HOST_ROOT, hold: bool = True) -> None:
        """Opens the directory and checks that it is still `identity`; `TargetGone` if not."""
        self.identity, self.root = identity, root
        self._base = proc_path(root, identity.pid)
        self._dir: int | None = None
        # st_size of a procfs `fd` directory is its number of entries (Linux 6.2 on): trusted once it
        # matched a listing (True); never asked again where it is 0 beside entries (False: an older kernel)
        self._fd_size_counts: bool | None = None
        if not hold:
            return  # every `stat` checks the identity
        try:
            self._dir = os.open(self._base, _DIRECTORY)
        except OSError as exc:
            raise translate_os_error(exc, self._base, identity.pid) from None
        try:
            check_live(parse_stat(self.read("stat")), identity.pid, identity.start_time, root)
        except BaseException:
            self.close()
            raise

    def __del__(self) -> None:
        self.close()

    @property
    def held(self) -> bool:
        return self._dir is not None

    def close(self) -> None:
        if self._dir is not None:
            os.close(self._dir)
            self._dir = None

    def read(self, name: str) -> bytes:
        """One file of the directory that the kernel renders whole (`read_piece`), with OS errors
        translated."""
        try:
            if self._dir is None:
                fd = os.open(f"{self._base}/{name}", os.O_RDONLY | os.O_CLOEXEC)
            else:
                fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self._dir)
            try:
                return read_piece(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise translate_os_error(exc, f"{self._base}/{name}", self.identity.pid) from None

    def stat(self) -> ProcStat:
        """`/proc/PID/stat`; `TargetGone` once the process exited (a zombie) or, when not held, its pid
        was reused."""
        stat = parse_stat(self.read("stat"))
        if self._dir is not None and stat.state not in ("Z", "X"):
            return stat  # the held directory is this process's: no start time to compare
        return check_live(stat, self.identity.pid, self.identity.start_time, self.root)

    def statm(self) -> ProcStatm:
        return parse_statm(self.read("statm"))

    def status(self) -> ProcStatus:
        """The figures of `status` (memory, context switches); its ids (`Uid`, `Gid`, `NSpid`) are
        left out: the process's identity is known."""
        return parse_status(self.read("status"), ids=False)

    def count_fds(self) -> int:
        """Open file descriptors: the entries of `fd` (needs ptrace access to the process, as a
        listing does; the size is trusted only after a listing succeeded)."""
        path = f"{self._base}/fd"
        try:
            if self._fd_size_counts:
                return self._stat_fd().st_size
            if self._dir is None:
                count = len(os.listdir(path))
            else:
                fd = os.open("fd", _DIRECTORY, dir_fd=self._dir)
                try:
                    count = len(os.listdir(fd))
                finally:
                    os.close(fd)
            if self._fd_size_counts is None and count > 0:
                size = self._stat_fd().st_size
                self._fd_size_counts = True if size == count else False if size == 0 else None
        except OSError as exc:
            raise translate_os_error(exc, path, self.identity.pid) from None
        return count

    def _stat_fd(self) -> os.stat_result:
        if self._dir is None:
            return os.stat(f"{self._base}/fd")
        return os.stat("fd", dir_fd=self._dir)


class ProcDirs:
    """The /proc directories of the processes a probe follows, by identity, at most `limit` held
    open. `using(identity)` lends one for the reads of one tick; `forget` closes it."""

    def __init__(self, root: Path = HOST_ROOT, limit: int | None = None) -> None:
        self.root = root
        self.limit = hold_limit() if limit is None else limit
        self._dirs: dict[ProcessIdentity, ProcDir] = {}
        self._lock = threading.Lock()  # a close must never meet a read: the number would be reused

    def using(self, identity: ProcessIdentity) -> _Lent:
        """The directory of `identity` for the reads of one tick (`with dirs.using(identity) as proc`),
        opened and checked on first use; `TargetGone` if it is gone, after which it is closed and
        forgotten."""
        return _Lent(self, identity)

    def _lend(self, identity: ProcessIdentity) -> ProcDir:
        proc = self._dirs.get(identity)
        if proc is None:
            proc = ProcDir(identity, self.root, hold=len(self._dirs) < self.limit)
            if proc.held:
                self._dirs[identity] = proc
        return proc

    def forget(self, identity: ProcessIdentity) -> None:
        with self._lock:
            proc = self._dirs.pop(identity, None)
            if proc is not None:
                proc.close()

    def held(self) -> int:
        with self._lock:
            return len(self._dirs)

    def close(self) -> None:
        with self._lock:
            for proc in self._dirs.values():
                proc.close()
            self._dirs.clear()

    def _close(self, identity: ProcessIdentity, proc: ProcDir) -> None:
        if self._dirs.get(identity) is proc:
            del self._dirs[identity]
        proc.close()


class _Lent:
    """One loan of a directory under the table's lock (a plain class: this runs for every process
    on every tick, and a generator-based context manager costs a microsecond more)."""

    __slots__ = ("_dirs", "_identity", "_proc")

    def __init__(self, dirs: ProcDirs, identity: ProcessIdentity) -> None:
        self._dirs, self._identity = dirs, identity
        self._proc: ProcDir | None = None

    def __enter__(self) -> ProcDir:
        self._dirs._lock.acquire()
        try:
            self._proc = self._dirs._lend(self._identity)
        except BaseException:
            self._dirs._lock.release()
            raise
        return self._proc

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        try:
            if kind is not None and issubclass(kind, TargetGone) and self._proc is not None:
                self._dirs._close(self._identity, self._proc)
        finally:
            self._dirs._lock.release()
