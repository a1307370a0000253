"""Remediation endpoints: the plan, the ledger, manual restarts, and the kill switch (pause/resume).

Reads are open like the rest of the API; every mutation needs the admin token and is recorded with
its reason. A manual restart goes through the same budget and coordinator as any other unless
`force` is given with a reason, which is logged.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from agent.remediate import Remediation
from agent.units import parse_duration
from remediation.model import RemediationRequest


class RestartRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(..., min_length=3, max_length=500)
    force: bool = False  # skip the budget and blockers (not the coordinator's slot); logged
    by: str | None = Field(None, max_length=100)


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(..., min_length=3, max_length=500)
    duration: str = Field("1h", description="how long, e.g. 30m, 2h; at most 7 days")
    by: str | None = Field(None, max_length=100)


class ResumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    by: str | None = Field(None, max_length=100)


def remediation_routes(remediation: Remediation, admin: list, instance_or_404) -> APIRouter:
    router = APIRouter(prefix="/api/v1")
    engine = remediation.engine

    @router.get("/plan")
    def plan() -> dict[str, Any]:
        return {"now": time.time(), **engine.snapshot()}

    @router.get("/actions")
    def actions(
        instance: str | None = None,
        since: float | None = Query(None, description="unix time"),
        limit: int = Query(100, ge=1, le=10_000),
    ) -> dict[str, Any]:
        return {
            "now": time.time(),
            "actions": engine.ledger.actions(instance=instance, since=since, limit=limit),
        }

    @router.get("/decisions")
    def decisions(instance: str | None = None, limit: int = Query(100, ge=1, le=10_000)) -> dict[str, Any]:
        return {"now": time.time(), "decisions": engine.ledger.decisions(instance=instance, limit=limit)}

    @router.post("/instances/{name}/restart", dependencies=admin)
    def restart(name: str, body: RestartRequest) -> dict[str, Any]:
        instance_or_404(name)
        request = RemediationRequest(
            name,
            "manual",
            f"manual-{name}-{int(time.time())}",
            body.reason,
            force=body.force,
            requested_by=body.by,
        )
        decision = engine.submit(request)
        if not decision.ok:
            raise HTTPException(409, f"restart of {name} refused: {decision.reason}")
        return {"instance": name, "accepted": decision.to_dict(), "mode": engine.snapshot().get("mode")}

    @router.post("/pause", dependencies=admin)
    def pause(body: PauseRequest) -> dict[str, Any]:
        try:
            seconds = parse_duration(body.duration)
        except ValueError as exc:
            raise HTTPException(400, f"duration: {exc}") from None
        if not 0 < seconds <= 7 * 86400:
            raise HTTPException(400, "duration: give between 1s and 7d; a pause always expires")
        try:
            return {"paused": engine.pause(body.reason, time.time() + seconds, body.by)}
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None

    @router.post("/resume", dependencies=admin)
    def resume(body: ResumeRequest | None = None) -> dict[str, Any]:
        previous = engine.resume((body or ResumeRequest()).by)
        return {"resumed": previous is not None, "previous_pause": previous}

    return router
