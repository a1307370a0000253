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
from typing import TypedDict

from agent.core.errors import ProbeAccessDenied, ProbeError, TargetGone
from probes.linux.procfs import HOST_ROOT
from probes.linux.procstatus import read_status


@dataclass(frozen=True, slots=True)
class ProcessIds:
    """The effective uid and gid of a process."""

    uid: int
    gid: int


def process_ids(pid: int, root: Path = HOST_ROOT) -> ProcessIds:
    """The effective ids of `pid` (from `/proc/PID/status`); raises `TargetGone` / `ProbeAccessDenied`."""
    try:
        status = read_status(pid, root)
    except ProbeError as exc:
        if isinstance(exc, (TargetGone, ProbeAccessDenied)):
            raise
        raise ProbeAccessDenied(f"cannot read the uid of process {pid} ({exc}): run medic as root") from None
    if status.effective_uid is None or status.effective_gid is None:
        raise ProbeAccessDenied(
            f"/proc/{pid}/status names no Uid or Gid: cannot tell as whom to run a helper"
        )
    return ProcessIds(status.effective_uid, status.effective_gid)


class RunAs(TypedDict, total=False):
    """`subprocess` keyword arguments that run a helper as another user (none: as medic)."""

    user: int
    group: int
    extra_groups: list[int]


def run_as(ids: ProcessIds | None, euid: int) -> RunAs:
    """`subprocess` keyword arguments that run a helper as `ids` when medic (`euid`) is root and the
    target is not; empty otherwise (a non-root medic cannot change user, and needs not)."""
    if ids is None or euid != 0 or ids.uid == 0:
        return {}
    return {"user": ids.uid, "group": ids.gid, "extra_groups": []}
