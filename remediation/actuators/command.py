"""`exec` actuator: run an argv command (`systemctl restart x`, `kubectl delete pod {instance}`), no shell.

Placeholders `{instance}`, `{pid}`, `{fleet}`, `{finding_id}`, `{kind}` are filled per argument.
Exit 0 is success; a failing command is reported with its status and the tail of its output; a
hanging one is killed with its whole session after the timeout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from remediation.actuators.base import STAGE, fill, run_command
from remediation.model import Decision, InstanceView, RemediationRequest


class CommandActuator:
    kind = "exec"

    def __init__(self, argv: Sequence[str], *, timeout: float = 120.0, env: Mapping[str, str] | None = None):
        self.argv = list(argv)
        self.timeout = timeout
        self.env = dict(env or {})

    def restart(self, view: InstanceView, request: RemediationRequest | None, timeout: float) -> Decision:
        argv = [fill(arg, view, request) for arg in self.argv]
        return run_command(argv, min(self.timeout, timeout), STAGE, self.env)
