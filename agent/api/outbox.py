"""`GET /api/v1/outbox`: what the notifier holds: queued, delivered and dead items, alerts, silences;
`POST /api/v1/outbox/requeue` (admin token): give dead letters another round once the target is fixed."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from agent.api.auth import TokenGuard
from agent.api.context import ApiContext
from agent.notify.config import delivery_names
from agent.notify.outbox import Outbox
from agent.notify.router import ensure_router_schema
from agent.notify.silences import ensure_silence_schema


class RequeueRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ids: list[Annotated[int, Field(ge=1, le=2**63 - 1)]] = Field(min_length=1, max_length=1000)
    reason: str = Field("requested through the API", max_length=500)


def outbox_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    outbox = Outbox(ctx.store, ctx.notify.retry)
    ensure_router_schema(ctx.store)
    ensure_silence_schema(ctx.store)
    configured = delivery_names(ctx.notify.sinks)  # an HA Alertmanager: one queue per replica

    @router.get("/api/v1/outbox")
    def outbox_items(
        state: str | None = Query(None, pattern="^(pending|delivered|dead)$"),
        sink: str | None = None,
        instance: str | None = None,
        limit: int = Query(100, ge=1, le=10_000),
    ) -> dict[str, Any]:
        now = time.time()
        items = outbox.items(state=state, sink=sink, instance=instance, limit=limit)
        stats = outbox.stats(configured)
        alerts = ctx.store.query(
            "SELECT key, severity, sinks, starts_at FROM notify_alerts WHERE state='firing' ORDER BY starts_at"
        )
        silences = ctx.store.query(
            """SELECT sink, silence_id, instance, action_id, alertname, until FROM notify_silences
               WHERE state='active' ORDER BY until"""
        )
        return {
            "now": now,
            "sinks": {
                name: {
                    "pending": s.pending,
                    "dead": s.dead,
                    "oldest_pending_age": None if s.oldest_pending is None else now - s.oldest_pending,
                }
                for name, s in stats.items()
            },
            "items": [item.to_dict() for item in items],
            "alerts": [
                {"key": k, "severity": sev, "sinks": sinks, "starts_at": st} for k, sev, sinks, st in alerts
            ],
            "silences": [
                {"sink": a, "silence_id": b, "instance": c, "action_id": d, "alertname": e, "until": f}
                for a, b, c, d, e, f in silences
            ],
        }

    guard = TokenGuard(ctx.token)

    @router.post("/api/v1/outbox/requeue")
    def requeue(body: RequeueRequest, who: str = Depends(guard)) -> dict[str, Any]:
        """Dead letters back to pending with fresh attempts; ids that are not dead are left alone."""
        ids = sorted(set(body.ids))
        requeued = outbox.dead_among(ids)
        if not requeued:
            raise HTTPException(
                404, f"none of {ids} is a dead letter; `medic events --outbox --state dead` lists them"
            )
        count = outbox.requeue_dead(requeued, time.time())
        ctx.events.emit(
            "outbox_requeued",
            f"{count} dead notification(s) queued again: {body.reason}",
            ids=requeued,
            reason=body.reason,
            by=who,
        )
        return {"requeued": requeued, "skipped": [i for i in ids if i not in requeued]}

    return router
