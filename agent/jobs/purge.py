"""Purge an instance's allocator through its hook (the soft fix) and record what it returned.

Used by `POST /api/v1/instances/{name}/purge`, `medic purge NAME` and the remediation ladder.
"""

from __future__ import annotations

from typing import Any

from agent.core.errors import ProbeError
from agent.core.records import ProbeTarget
from agent.state.eventlog import EventLog
from native_hooks.purge import purge
from probes.allocator import hook_socket_for


def purge_instance(target: ProbeTarget, events: EventLog, reason: str, gc: bool = False) -> dict[str, Any]:
    """Ask the hook to return free memory to the OS; an event records RSS before and after.

    Raises `ProbeError` subclasses (no hook, hook refused, timeout) after recording a `purge_failed` event.
    """
    try:
        socket = hook_socket_for(target)
        timeout = float((target.settings.get("hook") or {}).get("timeout") or 1.0)
        result = purge(socket, timeout=max(timeout, 10.0), gc=gc, pid=target.pid)
    except ProbeError as exc:
        events.emit(
            "purge_failed",
            f"purge failed: {exc}",
            instance=target.instance,
            severity="warning",
            reason=reason,
        )
        raise
    figures = result.to_dict()
    events.emit(
        "purge",
        f"{result.allocator} {result.action}: RSS {result.rss_before / 2**20:.1f} MiB → "
        f"{result.rss_after / 2**20:.1f} MiB, {result.returned_bytes / 2**20:.1f} MiB returned",
        instance=target.instance,
        reason=reason,
        **figures,
    )
    return figures
