"""The /proc parsing of medic: pure `parse_*` functions beside thin `read_*` readers, and the one
reading edge they share with `procstatus.py` (`/proc/PID/status`) and `nettcp.py` (`/proc/net/tcp`).

The parsers take the raw bytes of one file and return a record, or raise `ProbeError` saying what
was wrong; they never raise anything else. The readers take a pid and an injectable `root` (tests
point it at a fixture tree such as `tests/fixtures/proc`), read with one `os.open`/`os.read` (the
cheapest call: `statm` costs about 10 µs, `status` about 20 µs) and translate OS errors at the edge:

    FileNotFoundError / ProcessLookupError  → TargetGone          (the pid vanished)
    FileNotFoundError, pid still alive      → ProbeUnavailable    (this kernel lacks the file)
    PermissionError                         → ProbeAccessDenied   (says which capability helps)
    any other OSError, malformed content    → ProbeError
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from agent.core.errors import ProbeAccessDenied, ProbeError, ProbeUnavailable, TargetGone
from agent.core.records import ProcessIdentity

CLOCK_TICKS: int = os.sysconf("SC_CLK_TCK")
PAGE_SIZE: int = os.sysconf("SC_PAGE_SIZE")
HOST_ROOT = Path("/")

_ACCESS_HINT = (
    "run medic as the target's user, or as root with CAP_SYS_PTRACE (reading another user's "
    "smaps_rollup and fd need ptrace access)"
)
_GONE_ERRNOS = {errno.ENOENT, errno.ESRCH}
_READ_SIZE = 16384
PIECE_SIZE = 4096  # stat, statm and status of any process fit; a longer one takes more reads


# --------------------------------------------------------------------------- reading


def proc_path(root: Path, *parts: str | int) -> str:
    """`<root>/proc/<parts...>` as a plain string (cheaper than Path arithmetic on every tick)."""
    base = "" if root is HOST_ROOT else str(root).rstrip("/")
    return base + "/proc/" + "/".join(map(str, parts))


def read_raw(path: str) -> bytes:
    """The whole content of a file with one open and as few reads as possible; OSError passes through."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunk = os.read(fd, _READ_SIZE)
        if not chunk:
            return chunk
        chunks = [chunk]
        while chunk := os.read(fd, _READ_SIZE):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_piece(fd: int) -> bytes:
    """The rest of an open file that the kernel renders whole on the first read (`stat`, `statm` and
    `status` of a process): one read when it fits in `PIECE_SIZE`, a short read being its end."""
    data = os.read(fd, PIECE_SIZE)
    if len(data) < PIECE_SIZE:
        return data
    chunks = [data]
    while chunk := os.read(fd, _READ_SIZE):
        chunks.append(chunk)
    return b"".join(chunks)


def read_process_file(pid: int, name: str, root: Path = HOST_ROOT) -> bytes:
    """`/proc/PID/<name>`, a file rendered whole (see `read_piece`), with OS errors translated."""
    path = proc_path(root, pid, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return read_piece(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise translate_os_error(exc, path, pid) from None


def read_head(path: str, size: int) -> bytes:
    """At most the first `size` bytes of a file (all of it if shorter); OSError passes through."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunk = os.read(fd, size)
        if len(chunk) in (0, size):
            return chunk
        chunks = [chunk]
        got = len(chunk)
        while got < size and (chunk := os.read(fd, size - got)):
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_file(path: str, pid: int | None = None) -> bytes:
    """`read_raw` with OS errors translated into the `ProbeError` family (about `pid`, if given)."""
    try:
        return read_raw(path)
    except OSError as exc:
        raise translate_os_error(exc, path, pid) from None


def translate_os_error(exc: OSError, path: str, pid: int | None) -> ProbeError:
    """Map an OSError raised while reading `path` (of `pid`, if any) to the probe error family."""
    who = f" of pid {pid}" if pid is not None else ""
    if isinstance(exc, PermissionError):
        return ProbeAccessDenied(f"permission denied reading {path}{who}: {_ACCESS_HINT}")
    if exc.errno in _GONE_ERRNOS:
        if pid is None:
            return ProbeUnavailable(f"{path} does not exist: is /proc mounted (and the probe root right)?")
        marker = f"/proc/{pid}/"
        cut = path.find(marker)
        if exc.errno == errno.ENOENT and cut >= 0 and os.path.isdir(path[: cut + len(marker)]):
            return ProbeUnavailable(f"{path} does not exist on this kernel (pid {pid} is alive)")
        return TargetGone(f"process {pid} is gone ({path}: {exc.strerror})")
    return ProbeError(f"cannot read {path}{who}: {exc.strerror or exc}")


def malformed(what: str, detail: str, data: bytes) -> ProbeError:
    preview = data[:80].decode("utf-8", "backslashreplace")
    return ProbeError(f"malformed {what}: {detail} (starting {preview!r}); is the probe root a real /proc?")


def _int(value: bytes, what: str, data: bytes) -> int:
    try:
        return int(value)
    except ValueError:
        raise malformed(what, f"{value[:40]!r} is not an integer", data) from None


# --------------------------------------------------------------------------- /proc/PID/stat


class ProcStat(NamedTuple):
    """The figures medic uses from `/proc/PID/stat` (times already converted to seconds). A named
    tuple, as `ProcStatus`: made for every followed process on every tick, three times cheaper to make
    than a frozen dataclass."""

    pid: int
    comm: str
    state: str
    ppid: int
    minor_faults: int
    major_faults: int
    user_seconds: float
    system_seconds: float
    threads: int
    start_seconds_after_boot: float
    session: int = 0  # session id: a managed child leads its own (`start_new_session`)

    @property
    def cpu_seconds(self) -> float:
        return self.user_seconds + self.system_seconds


def parse_stat(data: bytes, clock_ticks: int = CLOCK_TICKS) -> ProcStat:
    """Parse `/proc/PID/stat`. `comm` may hold spaces and parentheses, so split at the last `)`."""
    what = "/proc/PID/stat"
    open_paren = data.find(b"(")
    close_paren = data.rfind(b")")
    if open_paren < 1 or close_paren < open_paren:
        raise malformed(what, "no '(comm)' field", data)
    fields = data[close_paren + 2 :].split()
    if len(fields) < 20:
        raise malformed(what, f"{len(fields) + 2} fields, expected at least 22", data)
    try:
        state = fields[0].decode("ascii")
    except UnicodeDecodeError:
        raise malformed(what, "the state field is not a letter", data) from None
    try:  # one handler for every number: this runs for every process on every tick
        return ProcStat(
            pid=int(data[:open_paren]),
            comm=data[open_paren + 1 : close_paren].decode("utf-8", "replace"),
            state=state,
            ppid=int(fields[1]),
            minor_faults=int(fields[7]),
            major_faults=int(fields[9]),
            user_seconds=int(fields[11]) / clock_ticks,
            system_seconds=int(fields[12]) / clock_ticks,
            threads=int(fields[17]),
            start_seconds_after_boot=int(fields[19]) / clock_ticks,
            session=int(fields[3]),
        )
    except ValueError:
        for value in (data[:open_paren], *(fields[i] for i in (1, 3, 7, 9, 11, 12, 17, 19))):
            _int(value, what, data)  # says which one
        raise malformed(what, "a field is not an integer", data) from None


def read_stat(pid: int, root: Path = HOST_ROOT) -> ProcStat:
    return parse_stat(read_process_file(pid, "stat", root))


# --------------------------------------------------------------------------- /proc/stat (boot time)


_BTIME_LINE = re.compile(rb"^btime[ \t]+([^\n]*)", re.MULTILINE)


def parse_boot_time(data: bytes) -> int:
    """Unix boot time (`btime`) from `/proc/stat`."""
    match = _BTIME_LINE.search(data)
    if not match:
        raise malformed("/proc/stat", "no 'btime' line", data)
    return _int(match.group(1), "/proc/stat", data)


_boot_times: dict[str, int] = {}


def read_boot_id(root: Path = HOST_ROOT) -> str | None:
    """This boot's random id (`/proc/sys/kernel/random/boot_id`), new at every boot; None when it
    cannot be read (a restricted /proc)."""
    try:
        text = read_raw(proc_path(root, "sys", "kernel", "random", "boot_id")).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if 0 < len(text) <= 64 else None


def boot_time(root: Path = HOST_ROOT) -> int:
    """Boot time, read once per root: a later clock step must not make every process look restarted."""
    key = str(root)
    if key not in _boot_times:
        _boot_times[key] = parse_boot_time(read_file(proc_path(root, "stat")))
    return _boot_times[key]


def start_time(stat: ProcStat, root: Path = HOST_ROOT) -> float:
    """Unix start time of the process described by `stat`."""
    return boot_time(root) + stat.start_seconds_after_boot


def process_identity(pid: int, root: Path = HOST_ROOT) -> ProcessIdentity:
    """pid + start time: equal identities mean the same process; a new start time means a restart."""
    return ProcessIdentity(pid=pid, start_time=start_time(read_stat(pid, root), root))


def same_process(start_a: float, start_b: float) -> bool:
    """Start times of one process agree to within one clock tick, however they were computed."""
    return abs(start_a - start_b) <= 1.0 / CLOCK_TICKS + 1e-6


def read_live_stat(pid: int, expected_start_time: float, root: Path = HOST_ROOT) -> ProcStat:
    """`read_stat` of a process known by its identity; `TargetGone` if it exited or the pid was reused.

    An `expected_start_time` of 0 or less skips the reuse check (identity not known yet).
    """
    return check_live(read_stat(pid, root), pid, expected_start_time, root)


def check_live(stat: ProcStat, pid: int, expected_start_time: float, root: Path = HOST_ROOT) -> ProcStat:
    """`stat` (of `pid`) when it is still the process known by its start time; `TargetGone` when that
    process exited or its pid now belongs to another (`read_live_stat` says more)."""
    if stat.state in ("Z", "X"):
        raise TargetGone(f"process {pid} has exited (a zombie waiting for its parent to reap it)")
    if expected_start_time > 0 and not same_process(start_time(stat, root), expected_start_time):
        raise TargetGone(
            f"pid {pid} now belongs to another process ({stat.comm!r}, started {start_time(stat, root):.2f}, "
            f"expected {expected_start_time:.2f}): the watched process is gone"
        )
    return stat


# --------------------------------------------------------------------------- /proc/PID/statm


@dataclass(frozen=True, slots=True)
class ProcStatm:
    vms_bytes: int
    rss_bytes: int
    shared_bytes: int


def parse_statm(data: bytes, page_size: int = PAGE_SIZE) -> ProcStatm:
    """Parse `/proc/PID/statm` (pages) into bytes."""
    fields = data.split()
    if len(fields) < 3:
        raise malformed("/proc/PID/statm", f"{len(fields)} fields, expected 7", data)
    what = "/proc/PID/statm"
    return ProcStatm(
        vms_bytes=_int(fields[0], what, data) * page_size,
        rss_bytes=_int(fields[1], what, data) * page_size,
        shared_bytes=_int(fields[2], what, data) * page_size,
    )


def read_statm(pid: int, root: Path = HOST_ROOT) -> ProcStatm:
    return parse_statm(read_process_file(pid, "statm", root))


# --------------------------------------------------------------------------- /proc/PID/smaps_rollup


@dataclass(frozen=True, slots=True)
class SmapsRollup:
    rss_bytes: int
    pss_bytes: int
    uss_bytes: int  # Private_Clean + Private_Dirty: what a restart would give back
    swap_bytes: int | None
    swap_pss_bytes: int | None


def parse_kb_table(data: bytes, what: str) -> dict[str, int]:
    """`Key:   N kB` lines (meminfo, smaps_rollup) → {key: bytes}; lines without a unit keep their number."""
    table: dict[str, int] = {}
    for line in data.split(b"\n"):
        key, sep, rest = line.partition(b":")
        if not sep:
            continue
        parts = rest.split()
        if not parts or len(parts) > 2 or (len(parts) == 2 and parts[1] != b"kB"):
            continue
        number = _int(parts[0], what, data)
        table[key.decode("ascii", "replace")] = number * 1024 if len(parts) == 2 else number
    return table


def parse_smaps_rollup(data: bytes) -> SmapsRollup:
    """Parse `/proc/PID/smaps_rollup` (one header line, then `Key: N kB` lines)."""
    what = "/proc/PID/smaps_rollup"
    if not data.strip():
        raise malformed(what, "it is empty (a zombie or a kernel thread has no memory map)", data)
    table = parse_kb_table(data, what)
    missing = [key for key in ("Rss", "Pss", "Private_Clean", "Private_Dirty") if key not in table]
    if missing:
        raise malformed(what, f"missing {', '.join(missing)}", data)
    return SmapsRollup(
        rss_bytes=table["Rss"],
        pss_bytes=table["Pss"],
        uss_bytes=table["Private_Clean"] + table["Private_Dirty"],
        swap_bytes=table.get("Swap"),
        swap_pss_bytes=table.get("SwapPss"),
    )


def read_smaps_rollup(pid: int, root: Path = HOST_ROOT) -> SmapsRollup:
    """PSS/USS: walks the target's page tables (milliseconds per GiB), so only on the slow schedule."""
    return parse_smaps_rollup(read_file(proc_path(root, pid, "smaps_rollup"), pid))


# --------------------------------------------------------------------------- /proc/meminfo


def parse_meminfo(data: bytes) -> dict[str, int]:
    """`/proc/meminfo` as {field: bytes} (unit-less fields such as HugePages_Total keep their count)."""
    table = parse_kb_table(data, "/proc/meminfo")
    if "MemTotal" not in table:
        raise malformed("/proc/meminfo", "no MemTotal line", data)
    return table


def host_memory_total(root: Path = HOST_ROOT) -> int:
    """Physical memory of the host in bytes (MemTotal): the last-resort memory limit."""
    return parse_meminfo(read_file(proc_path(root, "meminfo")))["MemTotal"]


# --------------------------------------------------------------------------- /proc/PID/environ


def parse_environ(data: bytes) -> dict[str, str]:
    """NUL-separated `KEY=VALUE` entries; undecodable bytes survive as surrogates (`os.fsencode` gives
    them back), entries without `=` or without a key are skipped, a repeated key keeps its last value."""
    env: dict[str, str] = {}
    for entry in os.fsdecode(data).split("\0"):  # NUL and = never occur inside a multi-byte character
        key, sep, value = entry.partition("=")
        if sep and key:
            env[key] = value
    return env


def read_environ(pid: int, root: Path = HOST_ROOT) -> dict[str, str]:
    """The environment `pid` started with (needs ptrace access; empty for a kernel thread or a zombie)."""
    return parse_environ(read_file(proc_path(root, pid, "environ"), pid))


# --------------------------------------------------------------------------- /proc/PID/cmdline, fd


def parse_cmdline(data: bytes) -> list[str]:
    """NUL-separated argv; a process that rewrote its title into one string gives one element."""
    if data.endswith(b"\0"):
        data = data[:-1]
    if not data:
        return []
    return [arg.decode("utf-8", "surrogateescape") for arg in data.split(b"\0")]


def read_cmdline(pid: int, root: Path = HOST_ROOT) -> list[str]:
    return parse_cmdline(read_file(proc_path(root, pid, "cmdline"), pid))


_DELETED = " (deleted)"


def read_exe(pid: int, root: Path = HOST_ROOT) -> str | None:
    """The program a process runs (`/proc/PID/exe`); None when it cannot be known (a kernel thread,
    or another user's process without ptrace access). A replaced binary reads as its old path."""
    path = proc_path(root, pid, "exe")
    try:
        target = os.readlink(path)
    except PermissionError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENOENT and os.path.isdir(proc_path(root, pid)):
            return None  # a kernel thread or a zombie: no executable
        raise translate_os_error(exc, path, pid) from None
    return target[: -len(_DELETED)] if target.endswith(_DELETED) else target


def count_fds(pid: int, root: Path = HOST_ROOT) -> int:
    """Open file descriptors: the entries of `/proc/PID/fd` (needs ptrace access to the target)."""
    path = proc_path(root, pid, "fd")
    try:
        return len(os.listdir(path))
    except OSError as exc:
        raise translate_os_error(exc, path, pid) from None
