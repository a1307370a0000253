"""Remediation endpoints: the plan, the ledger, manual restarts, and the kill switch (pause/resume).

Reads are open like the rest of the API; every mutation needs the admin token and is recorded with
its reason and, as `by`, the identity the token proves (`token:<hash prefix>`), never a name the
client sends: that one (`note`, or `by` as older CLIs send it) follows as `(note: …)`. A manual
restart goes through the same budget and coordinator as any other unless `force` is given with a
reason, which is logged.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from agent.api.auth import TokenGuard
from agent.core.units import parse_duration
from agent.jobs.remediation import Remediation
from remediation.model import RemediationRequest


class RestartRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(..., min_length=3, max_length=500)
    force: bool = False  # skip the budget and blockers (not the coordinator's slot); logged
    note: str | None = Field(None, max_length=100, description="who asks, as the client says; not trusted")
    by: str | None = Field(None, max_length=100, description="the old name of `note`")


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(..., min_length=3, max_length=500)
    duration: str = Field("1h", description="how long, e.g. 30m, 2h; at most 7 days")
    note: str | None = Field(None, max_length=100, description="who asks, as the client says; not trusted")
    by: str | None = Field(None, max_length=100, description="the old name of `note`")


class ResumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str | None = Field(None, max_length=100, description="who asks, as the client says; not trusted")
    by: str | None = Field(None, max_length=100, description="the old name of `note`")


def audit_by(identity: str, body: BaseModel | None) -> str:
    """The audit trail's `by`: the authenticated identity, with the client's own note beside it."""
    note = body and (getattr(body, "note", None) or getattr(body, "by", None))
    note = note and "".join(c for c in note if c.isprintable()).strip()
    return f"{identity} (note: {note})" if note else identity


def remediation_routes(remediation: Remediation, guard: TokenGuard, instance_or_404) -> APIRouter:
    """The routes; `guard` checks the admin token and names the caller for the audit trail."""
    router = APIRouter(prefix="/api/v1")
    engine = remediation.engine

    @router.get("/plan")
    def plan() -> dict[str, Any]:
        return {"now": time.time(), **engine.snapshot()}

    @router.get("/actions")
    def actions(
        instance: str | None = None,
        since: float | None = Query(None, ge=0, le=4102444800, allow_inf_nan=False, description="unix time"),
        limit: int = Query(100, ge=1, le=10_000),
    ) -> dict[str, Any]:
        return {
            "now": time.time(),
            "actions": engine.ledger.actions(instance=instance, since=since, limit=limit),
        }

    @router.get("/decisions")
    def decisions(instance: str | None = None, limit: int = Query(100, ge=1, le=10_000)) -> dict[str, Any]:
        return {"now": time.time(), "decisions": engine.ledger.decisions(instance=instance, limit=limit)}

    @router.post("/instances/{name}/restart")
    def restart(name: str, body: RestartRequest, who: str = Depends(guard)) -> dict[str, Any]:
        instance_or_404(name)
        request = RemediationRequest(
            name,
            "manual",
            f"manual-{name}-{int(time.time())}",
            body.reason,
            force=body.force,
            requested_by=audit_by(who, body),
        )
        decision = engine.submit(request)
        if not decision.ok:
            raise HTTPException(409, f"restart of {name} refused: {decision.reason}")
        return {"instance": name, "accepted": decision.to_dict(), "mode": engine.snapshot().get("mode")}

    @router.post("/pause")
    def pause(body: PauseRequest, who: str = Depends(guard)) -> dict[str, Any]:
        try:
            seconds = parse_duration(body.duration)
        except ValueError as exc:
            raise HTTPException(400, f"duration: {exc}") from None
        if not 0 < seconds <= 7 * 86400:
            raise HTTPException(400, "duration: give between 1s and 7d; a pause always expires")
        try:
            paused = engine.pause(body.reason, time.time() + seconds, audit_by(who, body))
            return {"paused": paused, **engine.pause_storage()}  # persisted: false on a full disk
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None

    @router.post("/resume")
    def resume(body: ResumeRequest | None = None, who: str = Depends(guard)) -> dict[str, Any]:
        previous = engine.resume(audit_by(who, body))
        return {"resumed": previous is not None, "previous_pause": previous, **engine.pause_storage()}

    return router
