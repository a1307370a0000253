"""`http` actuator: POST (or PUT) to a restart endpoint, e.g. an orchestrator's or the server's own.

The URL may hold placeholders (`{instance}`, `{pid}`, ...). The body is JSON naming the instance,
the finding and the reason. A 2xx answer is success.
"""

from __future__ import annotations

from collections.abc import Mapping

from remediation.actuators.base import STAGE, call_url, fill
from remediation.model import Decision, InstanceView, RemediationRequest


class HttpActuator:
    kind = "http"

    def __init__(
        self,
        url: str,
        *,
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url
        self.method = method
        self.headers = dict(headers or {})
        self.timeout = timeout

    def restart(self, view: InstanceView, request: RemediationRequest | None, timeout: float) -> Decision:
        body = {
            "instance": view.name,
            "pid": view.pid,
            "fleet": view.fleet,
            "finding_id": request.finding_id if request else None,
            "kind": request.kind if request else None,
            "reason": request.reason if request else None,
        }
        url = fill(self.url, view, request)
        return call_url(
            self.method, url, min(self.timeout, timeout), STAGE, json_body=body, headers=self.headers
        )
