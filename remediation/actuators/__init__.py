"""Actuators, selected per instance by `type` (one table):

    signal   TERM, grace, KILL; a supervisor brings the process back (needs `locate`)
    exec     an argv command with a timeout, output captured, no shell
    managed  medic relaunches the child it started (needs `managed_restart`)
    http     POST to a restart endpoint

No `actuator:` configured means `managed` for instances medic launched, else `signal`.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

from remediation.actuators.base import Actuator, Locator
from remediation.actuators.command import CommandActuator
from remediation.actuators.http_endpoint import HttpActuator
from remediation.actuators.managed import ManagedActuator, ManagedRestart
from remediation.actuators.signals import SignalActuator, check_identity
from remediation.errors import ActuatorError
from remediation.model import InstanceView

if TYPE_CHECKING:
    from remediation.config import ActuatorSection

__all__ = [
    "Actuator",
    "ActuatorHooks",
    "CommandActuator",
    "HttpActuator",
    "Locator",
    "ManagedActuator",
    "ManagedRestart",
    "SignalActuator",
    "check_identity",
    "create_actuator",
]


@dataclass(frozen=True, slots=True)
class ActuatorHooks:
    """What the runtime injects for the actuators that need it."""

    locate: Locator | None = None
    managed_restart: ManagedRestart | None = None


def create_actuator(spec: ActuatorSection | None, view: InstanceView, hooks: ActuatorHooks) -> Actuator:
    """The actuator for one instance; `ActuatorError` when the runtime did not inject what it needs."""
    kind = spec.type if spec is not None else ("managed" if view.managed else "signal")
    if kind == "managed":
        if hooks.managed_restart is None:
            raise ActuatorError(
                f"{view.name}: the managed actuator needs the agent's managed-process restart hook; "
                "use it only for instances medic launches (command:), or choose signal, exec or http"
            )
        return ManagedActuator(hooks.managed_restart, timeout=getattr(spec, "timeout", 60.0))
    if kind == "signal":
        if hooks.locate is None:
            raise ActuatorError(f"{view.name}: the signal actuator needs a process locator from the agent")
        if spec is not None and spec.type == "signal":
            return SignalActuator(
                hooks.locate,
                sig=getattr(signal, f"SIG{spec.signal}"),
                grace=spec.grace,
                kill=spec.kill,
                start_timeout=spec.start_timeout,
            )
        return SignalActuator(hooks.locate)
    if spec is not None and spec.type == "exec":
        return CommandActuator(spec.command, timeout=spec.timeout, env=spec.env)
    if spec is not None and spec.type == "http":
        return HttpActuator(spec.url, method=spec.method, headers=spec.headers, timeout=spec.timeout)
    raise ActuatorError(f"{view.name}: unknown actuator type {kind!r}; known: signal, exec, managed, http")
