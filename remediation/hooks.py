"""What the agent's runtime injects into the engine: every callable optional, the engine says what is missing."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from remediation.actuators import Locator, ManagedRestart
from remediation.blockers import Blocker
from remediation.evidence import CaptureFn
from remediation.model import Decision, InstanceView, Intent, RemediationRequest
from remediation.verify import WarmupGate

# purge(view, timeout) -> Decision (ok with e.g. data released_bytes); the allocator part provides it
PurgeFn = Callable[[InstanceView, float], Decision]


@dataclass(frozen=True)
class EngineHooks:
    locate: Locator | None = None  # instance name -> its current process identity
    managed_restart: ManagedRestart | None = None  # (instance, timeout) -> new pid
    purge: PurgeFn | None = None
    can_purge: Callable[[InstanceView], bool] | None = None  # does this instance offer a purge?
    warmup_gate: WarmupGate | None = None
    captures: Mapping[str, CaptureFn] = field(default_factory=dict)
    on_escalate: Callable[[InstanceView, RemediationRequest, Intent], None] | None = None
    blockers: Sequence[Blocker] = ()  # extra blockers, checked after the configured ones
