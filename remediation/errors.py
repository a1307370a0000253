"""Errors of the remediation engine, in medic's one exception family (`agent.core.errors.MedicError`).

    MedicError
    └── RemediationError            anything the engine refuses or cannot do
        ├── CoordinatorError        the coordinator answered, but not as expected (bad data, protocol)
        │   ├── CoordinatorUnavailable  unreachable, slow or refusing: no restart may happen
        │   └── LeaseLost           a slot's lease expired or was revoked while held
        ├── NotShared               a fleet-wide control asked of an agent whose coordinator is its own
        └── ActuatorError           an actuator could not be built from its settings

The engine turns each into a blocked decision with its reason; none reaches the agent's loop.
"""

from __future__ import annotations

from agent.core.errors import MedicError


class RemediationError(MedicError):
    """The remediation engine cannot do what was asked; the message says why and what to do."""


class CoordinatorError(RemediationError):
    """The coordinator answered something medic cannot use."""


class CoordinatorUnavailable(CoordinatorError):
    """The coordinator cannot be reached in time: treated as "no restart", never as "go ahead"."""


class LeaseLost(CoordinatorError):
    """A restart slot's lease is gone (expired or revoked): another agent may hold the slot now."""


class NotShared(RemediationError):
    """The agent shares no coordinator with other agents, so a fleet-wide control means nothing."""


class ActuatorError(RemediationError):
    """An actuator's settings are unusable (unknown type, missing callable, bad template)."""
