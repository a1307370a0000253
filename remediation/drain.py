"""Drain before a restart: tell the instance (or its load balancer) to stop taking traffic, then wait.

One HTTP POST or one argv command (placeholders as for actuators), then `settle` seconds for
in-flight requests to finish. A failed drain stops the restart: the instance is still serving.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from remediation.actuators.base import call_url, fill, run_command
from remediation.model import Decision, InstanceView, RemediationRequest

if TYPE_CHECKING:
    from remediation.config import DrainSection

STAGE = "drain"


class Drain:
    def __init__(self, section: DrainSection) -> None:
        self.section = section

    def run(self, view: InstanceView, request: RemediationRequest | None, stop: threading.Event) -> Decision:
        s = self.section
        if s.http is not None:
            body = {"instance": view.name, "pid": view.pid, "reason": request.reason if request else None}
            done = call_url("POST", fill(s.http, view, request), s.timeout, STAGE, json_body=body)
        else:
            done = run_command([fill(arg, view, request) for arg in s.command or []], s.timeout, STAGE)
        if not done.ok:
            return Decision.block(
                STAGE, done.code, f"drain failed, not restarting: {done.reason}", **done.data
            )
        if s.settle > 0 and stop.wait(s.settle):
            return Decision.block(
                STAGE, "stopped", "the agent is stopping; restart abandoned after the drain"
            )
        return Decision.allow(STAGE, f"drained ({done.reason}); waited {s.settle:g}s", **done.data)
