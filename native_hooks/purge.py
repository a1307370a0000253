"""The soft remedy: ask a target's hook to give freed memory back to the OS, and say how much came back.

jemalloc purges the dirty pages of every arena, tcmalloc releases its free page heap, glibc trims
every arena. RSS is measured inside the target just before and after, so the figure is the purge's
own effect. The API (`POST /api/v1/instances/{name}/purge`), `medic purge NAME` and the remediation
ladder call `purge()`; they record the result as an event.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from native_hooks.client import HookClient
from probes.linux.procfs import HOST_ROOT

DEFAULT_TIMEOUT_S = 10.0  # a trim of a large fragmented glibc heap walks every free chunk


@dataclass(frozen=True, slots=True)
class PurgeResult:
    allocator: str
    action: str
    rss_before: int
    rss_after: int
    returned_bytes: int
    duration_s: float
    pid: int
    hook: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def purge(
    socket: str | os.PathLike[str],
    timeout: float = DEFAULT_TIMEOUT_S,
    gc: bool = False,
    *,
    pid: int | None = None,
    root: Path = HOST_ROOT,
) -> PurgeResult:
    """Purge through the hook at `socket`; `gc=True` also runs Python's collector first (Python hook only).

    `pid` is the target: the hook is trusted only when that process serves the socket (None, for a
    path given by hand: when root, medic's user or the socket file's owner serves it). Raises `HookNotFound`, `HookAccessDenied`, `HookTimeout`, `HookOpUnavailable` (allocator cannot purge)
    or `HookRequestError`.
    """
    params = {"gc": True} if gc else {}
    with HookClient(socket, timeout, pid=pid, root=root) as client:
        reply = client.request("purge", **params)
    before, after = int(reply["rss_before"]), int(reply["rss_after"])
    return PurgeResult(
        allocator=str(reply.get("allocator", "unknown")),
        action=str(reply.get("action", "")),
        rss_before=before,
        rss_after=after,
        returned_bytes=max(0, before - after),
        duration_s=float(reply.get("duration_s", 0.0)),
        pid=int(reply.get("pid", 0)),
        hook=str(reply.get("hook", "")),
    )
