"""Remediation endpoints: the plan, the ledger, manual restarts, and the kill switch (pause/resume).

Reads are open like the rest of the API; every mutation needs the admin token and is recorded with
its reason and, as `by`, the identity the token proves (`token:<hash prefix>`), never a name the
client sends: that one (`note`, or `by` as older CLIs send it) follows as `(note: …)`. The pause
and resume take a `scope`: `agent` (this agent, the default) or `fleet` (every agent of the
namespace, through the coordinator: 409 when this agent shares none, 503 when it cannot be
written). A manual restart goes through the same budget and coordinator as any other unless
`force` is given with a reason, which is logged; it is judged by a step run at once, so the answer
says whether it started, would start (dry-run), or is held and why (its action in the ledger keeps
saying so until it is carried out). Clearing an escalation (`POST /instances/{name}/clear`) lets remediation
and the supervisor's relaunches act on the instance again; the evidence of an action is read back
item by item (`GET /actions/{id}/evidence/{item}`).
"""

from __future__ import annotations

import base64
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from agent.api.auth import TokenGuard
from agent.core.units import parse_duration
from agent.jobs.remediation import Remediation
from agent.watch.instances import InstanceState
from remediation.engine import Engine
from remediation.errors import CoordinatorError, NotShared
from remediation.model import Decision, RemediationRequest

Scope = Literal["agent", "fleet"]
SCOPE = "agent: this agent only (the default); fleet: every agent of the namespace, through the coordinator"


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
    scope: Scope = Field("agent", description=SCOPE)
    note: str | None = Field(None, max_length=100, description="who asks, as the client says; not trusted")
    by: str | None = Field(None, max_length=100, description="the old name of `note`")


class ResumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scope: Scope = Field("agent", description=SCOPE)
    note: str | None = Field(None, max_length=100, description="who asks, as the client says; not trusted")
    by: str | None = Field(None, max_length=100, description="the old name of `note`")


def audit_by(identity: str, body: BaseModel | None) -> str:
    """The audit trail's `by`: the authenticated identity, with the client's own note beside it."""
    note = body and (getattr(body, "note", None) or getattr(body, "by", None))
    note = note and "".join(c for c in note if c.isprintable()).strip()
    return f"{identity} (note: {note})" if note else identity


MAX_EVIDENCE_READ = 16 * 2**20


def read_evidence(engine: Engine, path: str) -> bytes:
    """One stored evidence file: only under the engine's evidence directory, never through a symlink,
    at most `MAX_EVIDENCE_READ` bytes; a file pruned since is a 404 that says so."""
    store = engine.restarts.evidence
    root = os.path.realpath(store.directory) if store is not None else None
    real = os.path.realpath(path)
    if root is None or os.path.commonpath([root, real]) != root:
        raise HTTPException(404, f"{path} is not in the evidence directory")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise HTTPException(404, f"{path}: {exc.strerror} (pruned?)") from None
    try:
        return os.read(fd, MAX_EVIDENCE_READ)
    finally:
        os.close(fd)


@contextmanager
def fleet_errors(what: str) -> Iterator[None]:
    """A fleet-wide control's failures as answers: 400 bad input, 409 no shared coordinator, 503
    the coordinator cannot be written (the fleet is then not `what`)."""
    try:
        yield
    except NotShared as exc:
        raise HTTPException(409, str(exc)) from None
    except CoordinatorError as exc:
        raise HTTPException(
            503, f"the fleet was not {what}: {exc}; `medic pause` still holds this agent meanwhile"
        ) from None
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


def request_status(decision: Decision | None) -> str:
    """A person's restart request after the step that judged it: `started`, `would-restart`
    (dry-run), `held` (kept, and the decision says why), or `requested` (not judged yet)."""
    if decision is None:
        return "requested"
    if decision.code == "started":
        return "started"
    if decision.code == "dry-run":
        return "would-restart"
    return "held" if not decision.ok else "requested"


def remediation_routes(
    remediation: Remediation, guard: TokenGuard, instance_or_404: Callable[[str], InstanceState]
) -> APIRouter:
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

    @router.get("/actions/{action_id}")
    def action(action_id: int = Path(..., ge=1, le=2**62)) -> dict[str, Any]:
        found = engine.ledger.action(action_id)
        if found is None:
            raise HTTPException(404, f"no action {action_id}; `medic actions` lists them")
        return {"now": time.time(), "action": found}

    @router.get("/actions/{action_id}/evidence/{item}")
    def evidence_item(
        action_id: int = Path(..., ge=1, le=2**62), item: str = Path(..., min_length=1, max_length=200)
    ) -> dict[str, Any]:
        found = engine.ledger.action(action_id)
        if found is None:
            raise HTTPException(404, f"no action {action_id}; `medic actions` lists them")
        entry = next((e for e in found.get("evidence") or [] if e.get("name") == item), None)
        if entry is None or not entry.get("path"):
            names = ", ".join(e["name"] for e in found.get("evidence") or [] if e.get("path")) or "none"
            raise HTTPException(404, f"action {action_id} has no evidence item {item!r}; it has: {names}")
        data = read_evidence(engine, entry["path"])
        try:
            content, encoding = data.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            content, encoding = base64.b64encode(data).decode("ascii"), "base64"
        return {"action_id": action_id, **entry, "encoding": encoding, "content": content}

    @router.post("/instances/{name}/clear")
    def clear(name: str, body: ResumeRequest | None = None, who: str = Depends(guard)) -> dict[str, Any]:
        instance_or_404(name)
        if not remediation.clear(name, audit_by(who, body)):
            raise HTTPException(409, f"{name} has no escalation to clear")
        return {"instance": name, "cleared": True}

    @router.get("/decisions")
    def decisions(instance: str | None = None, limit: int = Query(100, ge=1, le=10_000)) -> dict[str, Any]:
        return {"now": time.time(), "decisions": engine.ledger.decisions(instance=instance, limit=limit)}

    @router.post("/instances/{name}/restart")
    def restart(name: str, body: RestartRequest, who: str = Depends(guard)) -> dict[str, Any]:
        instance_or_404(name)
        request = RemediationRequest(
            name,
            "manual",
            # every ask its own case: two asks within one second must not share the first one's restart
            f"manual-{name}-{int(time.time())}-{secrets.token_hex(4)}",
            body.reason,
            force=body.force,
            requested_by=audit_by(who, body),
        )
        accepted, decision = remediation.ask(request)
        if not accepted.ok:
            raise HTTPException(409, f"restart of {name} refused: {accepted.reason}")
        return {
            "instance": name,
            "accepted": accepted.to_dict(),
            "action_id": accepted.data.get("action_id"),
            "decision": decision.to_dict() if decision is not None else None,
            "status": request_status(decision),
            "mode": engine.mode,
        }

    @router.post("/pause")
    def pause(body: PauseRequest, who: str = Depends(guard)) -> dict[str, Any]:
        try:
            seconds = parse_duration(body.duration)
        except ValueError as exc:
            raise HTTPException(400, f"duration: {exc}") from None
        if not 0 < seconds <= 7 * 86400:
            raise HTTPException(400, "duration: give between 1s and 7d; a pause always expires")
        if body.scope == "fleet":
            with fleet_errors("paused"):
                paused = engine.pause_fleet(body.reason, time.time() + seconds, audit_by(who, body))
            return {"scope": "fleet", "paused": paused, "coordinator": engine.coordinator.describe()}
        try:
            paused = engine.pause(body.reason, time.time() + seconds, audit_by(who, body))
            return {"paused": paused, **engine.pause_storage()}  # persisted: false on a full disk
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None

    @router.post("/resume")
    def resume(body: ResumeRequest | None = None, who: str = Depends(guard)) -> dict[str, Any]:
        if body is not None and body.scope == "fleet":
            with fleet_errors("resumed"):
                previous = engine.resume_fleet(audit_by(who, body))
            coordinator = engine.coordinator.describe()
            return {
                "scope": "fleet",
                "resumed": previous is not None,
                "previous_pause": previous,
                "coordinator": coordinator,
            }
        previous = engine.resume(audit_by(who, body))
        return {"resumed": previous is not None, "previous_pause": previous, **engine.pause_storage()}

    return router
