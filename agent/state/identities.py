"""What each instance's process was when medic adopted it, kept across agent restarts.

`state_dir/identities.json` (0600, written atomically) holds, per instance, the pid and start
time of the process it follows, what its matcher matched then (the program and the command line),
the matcher itself, and whether medic launched it (a managed child). Two things depend on it:

- a new agent adopts the managed children an earlier agent launched (killed with -9, they run on)
  instead of launching a second copy, and stops those no longer configured;
- a `pid` or `pidfile` instance whose process was replaced (while an agent watched or not) is
  taken over only by its successor, never by an unrelated process that got the reused pid. For a
  `pid` instance the successor runs the same program and command line. For a `pidfile` instance it
  may also be a new version (another path, other flags): what counts is that the pidfile was
  written anew for it, as a service manager does when it restarts the service. So the pidfile's
  stamp (mtime and inode) is recorded too, and kept current while the process runs.

A missing file is an empty ledger; an unreadable or malformed one is logged and treated as empty
(the agent then launches managed commands afresh, as before the ledger existed).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.core.errors import ProbeError, UnsafePath
from probes.linux.fstrust import atomic_write, open_owned_file
from probes.linux.pidfd import Expected
from probes.linux.procfs import read_cmdline, read_exe

log = logging.getLogger("medic.identities")

FILE_NAME = "identities.json"
_MAX_BYTES = 4 << 20
# a start time is computed from the boot time in whole seconds (/proc/stat btime): it may be off by
# up to a second from the wall clock that stamps the pidfile
_CLOCK_SLACK_S = 1.0

PidfileStamp = tuple[int, int]  # (st_mtime_ns, st_ino): a rewrite in place or a rename changes it


@dataclass(frozen=True, slots=True)
class AdoptedProcess:
    """One instance's process as adopted: identity, what matched, under which matcher."""

    pid: int
    start_time: float
    exe: str | None
    cmdline: tuple[str, ...]
    match: str  # `matcher_key` of the spec it was adopted under: a changed config inherits nothing
    launched: bool = False  # a managed child medic started (it leads its own session)
    pidfile_stamp: PidfileStamp | None = None  # a `pidfile` instance: the file as it named this pid

    def expected(self) -> Expected:
        """The identity a managed child must still have to be adopted: pid, start time, and the
        session it leads (not the program: a launcher script may `exec` another one)."""
        return Expected(self.pid, self.start_time, session_leader=self.launched)


def describe(
    pid: int,
    start_time: float,
    match: str,
    launched: bool = False,
    pidfile_stamp: PidfileStamp | None = None,
) -> AdoptedProcess:
    """The record of a live process, read now; `ProbeError` when it has gone."""
    exe, cmdline = read_exe(pid), tuple(read_cmdline(pid))
    return AdoptedProcess(pid, start_time, exe, cmdline, match, launched, pidfile_stamp)


def pidfile_stamp(path: str | os.PathLike[str]) -> PidfileStamp | None:
    """The pidfile's (mtime in ns, inode), or None when it cannot be read."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_ino


def pidfile_rewritten(
    record: AdoptedProcess, stamp: PidfileStamp | None, start_time: float
) -> tuple[bool, str]:
    """Was the pidfile written anew for the process that started at `start_time`, since `record`
    was adopted? With the reason either way.

    A service manager that restarts the service writes the pidfile after the new process exists;
    a pid that an unrelated process inherited leaves the file as it was when the old one ran.
    """
    if stamp is None:
        return False, "the pidfile cannot be read"
    if stamp == record.pidfile_stamp:
        return False, f"the pidfile is unchanged since pid {record.pid} was adopted"
    if stamp[0] / 1e9 < start_time - _CLOCK_SLACK_S:
        return False, "the pidfile was last written before that process started"
    return True, "the pidfile was written anew for it"


def same_program(record: AdoptedProcess, pid: int) -> tuple[bool, str]:
    """Does `pid` run what `record` matched (program, and command line)? With the reason if not."""
    try:
        exe, cmdline = read_exe(pid), tuple(read_cmdline(pid))
    except ProbeError as exc:
        return False, f"pid {pid} is gone: {exc}"
    if exe is not None and record.exe is not None and exe != record.exe:
        return False, f"pid {pid} runs {exe}, not {record.exe}"
    if cmdline != record.cmdline:
        return False, f"pid {pid} runs {_show(cmdline)}, not {_show(record.cmdline)}"
    return True, f"pid {pid} runs {_show(cmdline)}"


def _show(cmdline: tuple[str, ...]) -> str:
    text = " ".join(cmdline) or "(no command line)"
    return repr(text if len(text) <= 100 else text[:97] + "...")


class IdentityLedger:
    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / FILE_NAME
        self.records: dict[str, AdoptedProcess] = self._load()

    def get(self, name: str) -> AdoptedProcess | None:
        return self.records.get(name)

    def put(self, name: str, record: AdoptedProcess) -> None:
        if self.records.get(name) != record:
            self.records[name] = record
            self._save()

    def drop(self, *names: str) -> None:
        if any(self.records.pop(name, None) is not None for name in list(names)):
            self._save()

    def _load(self) -> dict[str, AdoptedProcess]:
        try:
            raw = open_owned_file(self.path, {os.geteuid()}, max_bytes=_MAX_BYTES)
        except FileNotFoundError:
            return {}
        except (OSError, UnsafePath) as exc:
            log.warning("ignoring %s: %s", self.path, exc)
            return {}
        try:
            data = json.loads(raw)
            return {name: _record(item) for name, item in data["instances"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring %s: malformed (%s); managed commands start afresh", self.path, exc)
            return {}

    def _save(self) -> None:
        body = {"instances": {name: asdict(rec) for name, rec in sorted(self.records.items())}}
        try:
            atomic_write(self.path, json.dumps(body, indent=1).encode(), mode=0o600, fsync=False)
        except OSError as exc:  # best effort, like the store's instance table: never stop following
            log.warning("cannot write %s: %s", self.path, exc.strerror or exc)


def _record(item: Any) -> AdoptedProcess:
    return AdoptedProcess(
        pid=int(item["pid"]),
        start_time=float(item["start_time"]),
        exe=None if item.get("exe") is None else str(item["exe"]),
        cmdline=tuple(str(arg) for arg in item.get("cmdline", ())),
        match=str(item["match"]),
        launched=bool(item.get("launched", False)),
        pidfile_stamp=_stamp(item.get("pidfile_stamp")),
    )


def _stamp(value: Any) -> PidfileStamp | None:
    if value is None:
        return None
    mtime_ns, inode = value
    return int(mtime_ns), int(inode)
