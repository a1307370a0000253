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

from agent.core.figures import is_figure
from native_hooks.client import HookClient
from native_hooks.errors import HookProtocolError
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
    return purge_result(reply)


def purge_result(reply: dict[str, Any]) -> PurgeResult:
    """The hook's purge reply read as figures, or `HookProtocolError` when it lacks sane ones."""
    before, after, took, pid = (reply.get(k) for k in ("rss_before", "rss_after", "duration_s", "pid"))
    if not (is_figure(before) and is_figure(after) and (took is None or is_figure(took))):
        raise HookProtocolError(
            f"the hook's purge reply lacks sane rss_before, rss_after and duration_s figures: {str(reply)[:200]}"
        )
    return PurgeResult(
        allocator=str(reply.get("allocator", "unknown"))[:100],
        action=str(reply.get("action", ""))[:200],
        rss_before=int(before),
        rss_after=int(after),
        returned_bytes=max(0, int(before) - int(after)),
        duration_s=float(took or 0.0),
        pid=int(pid) if isinstance(pid, int) and is_figure(pid) else 0,
        hook=str(reply.get("hook", ""))[:200],
    )
