"""`managed` actuator: medic restarts the child it launched (`medic run -- CMD`, or `command:`).

The runtime injects `restart(instance, timeout) -> new pid | None` (its `ManagedProcess`: stop
with TERM then KILL, launch again). Any exception it raises is reported, never propagated.
"""

from __future__ import annotations

from collections.abc import Callable

from remediation.actuators.base import STAGE
from remediation.model import Decision, InstanceView, RemediationRequest

ManagedRestart = Callable[[str, float], "int | None"]


class ManagedActuator:
    kind = "managed"

    def __init__(self, restart: ManagedRestart, *, timeout: float = 60.0) -> None:
        self._restart = restart
        self.timeout = timeout

    def restart(self, view: InstanceView, request: RemediationRequest | None, timeout: float) -> Decision:
        try:
            pid = self._restart(view.name, min(self.timeout, timeout))
        except Exception as exc:  # the injected callable is not ours: report whatever it raises
            return Decision.block(STAGE, "failed", f"restarting managed {view.name} failed: {exc}")
        if pid is None:
            return Decision.block(STAGE, "not-restarted", f"managed {view.name} did not start again")
        return Decision.allow(STAGE, f"relaunched managed {view.name}: pid {view.pid} → {pid}", new_pid=pid)
