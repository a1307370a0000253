"""As whom medic runs a helper program (jcmd, c++filt) on a target's behalf.

A helper found in a trusted place (`fstrust.trusted_program`) still reads what the target controls:
jcmd talks to the target's attach socket, c++filt demangles names from the target's files. When
medic is root and the target is not, the helper runs with the target's effective uid and gid and no
supplementary groups, so a hostile target gains nothing by attacking it. jcmd needs that anyway: a
JVM accepts attach requests from its own user.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core.errors import ProbeAccessDenied, TargetGone
from probes.linux.procfs import HOST_ROOT, proc_path, read_raw


@dataclass(frozen=True, slots=True)
class ProcessIds:
    """The effective uid and gid of a process."""

    uid: int
    gid: int


def parse_ids(data: bytes) -> ProcessIds:
    """The effective ids from `/proc/PID/status` (`Uid:`/`Gid:` lines: real, effective, saved, fs)."""
    found: dict[bytes, int] = {}
    for line in data.splitlines():
        key, _, rest = line.partition(b":")
        if key in (b"Uid", b"Gid"):
            fields = rest.split()
            if len(fields) < 2 or not fields[1].isdigit():
                raise ValueError(f"/proc/PID/status: malformed {key.decode()} line {line[:80]!r}")
            found[key] = int(fields[1])
    if len(found) != 2:
        raise ValueError("/proc/PID/status has no Uid or Gid line")
    return ProcessIds(found[b"Uid"], found[b"Gid"])


def process_ids(pid: int, root: Path = HOST_ROOT) -> ProcessIds:
    """The effective ids of `pid`; raises `TargetGone` / `ProbeAccessDenied`."""
    try:
        return parse_ids(read_raw(proc_path(root, pid, "status")))
    except FileNotFoundError:
        raise TargetGone(f"process {pid} is gone") from None
    except (OSError, ValueError) as exc:
        raise ProbeAccessDenied(f"cannot read the uid of process {pid} ({exc}): run medic as root") from None


def run_as(ids: ProcessIds | None, euid: int) -> dict[str, Any]:
    """`subprocess` keyword arguments that run a helper as `ids` when medic (`euid`) is root and the
    target is not; empty otherwise (a non-root medic cannot change user, and needs not)."""
    if ids is None or euid != 0 or ids.uid == 0:
        return {}
    return {"user": ids.uid, "group": ids.gid, "extra_groups": []}
