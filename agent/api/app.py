"""The agent's HTTP surface: `/metrics`, `/healthz` and the JSON API under `/api/v1`.

Handlers only read: the tracker's snapshot and the store. They are plain `def` functions so
that SQLite reads run in the server's thread pool, off the event loop.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent import __version__
from agent.api.alertmanager import PATH as RECEIVER_PATH
from agent.api.alertmanager import create_router as create_integrations_router
from agent.api.auth import TokenGuard
from agent.api.context import ApiContext
from agent.api.dashboard import dashboard_routes
from agent.api.guard import HttpGuard, allowed_hosts, route_policies
from agent.api.histograms import histogram_routes
from agent.api.instances import instances_routes
from agent.api.query import parse_time
from agent.api.remediation import remediation_routes
from agent.core.catalog import CATALOG
from agent.core.errors import ProbeError
from agent.core.records import ProbeTarget
from agent.core.units import parse_duration
from agent.jobs.purge import purge_instance
from agent.notify.external import external_findings
from agent.watch.instances import InstanceState

MAX_POINTS = 2000
MAX_ID = 2**63 - 1  # SQLite's INTEGER
RECEIVER_SLACK = 64 * 1024  # the receiver counts its own max_body (and its 413 metric); this is a backstop
log = logging.getLogger("medic.api")
# FastAPI 0.165 traces, measures and logs every request through OpenTelemetry as soon as a global
# provider exists (one an auto-instrumentation wrapper sets up in the pod, say), and sets up OTLP
# exporters from OTEL_* variables when FASTAPI_OTEL_AUTO_CONFIGURE=true: the agent exports its own
# /metrics and never sends spans or logs elsewhere because of its environment
NO_OPENTELEMETRY = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "operation_spans": False,
    "auto_configure": False,
}


class PurgeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field("requested through the API", max_length=500)
    gc: bool = False  # Python hook only: run the garbage collector first


def _field_name(part: object) -> str:
    """A field of a validation error as the client sent it, quoted when it is not a plain name: a key
    of the request's body may hold a newline or anything else, and the error is one line."""
    text = str(part)
    return (
        text
        if text.isascii() and text.isprintable() and text.strip() == text and text
        else json.dumps(text)[:80]
    )


def _without_opentelemetry() -> dict[str, Any]:
    """`telemetry=` all off where FastAPI has it (0.165 on); an older FastAPI has no telemetry at all."""
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {"telemetry": dict(NO_OPENTELEMETRY)}
    return {}


def create_app(ctx: ApiContext) -> FastAPI:
    # no Swagger UI or ReDoc: they load from a CDN; the schema stays at /openapi.json
    app = FastAPI(
        title="sidecar-medic", version=__version__, docs_url=None, redoc_url=None, **_without_opentelemetry()
    )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            f"{'.'.join(_field_name(p) for p in err.get('loc', ()) if p not in ('query', 'body', 'path'))}: "
            f"{err.get('msg')}"
            for err in exc.errors()
        ]
        return JSONResponse({"error": "; ".join(problems)[:2000]}, status_code=400)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse(
            {"error": f"internal error ({type(exc).__name__}); the agent log has the details"},
            status_code=500,
        )

    guard = TokenGuard(ctx.token)  # runs again in HttpGuard, before any body is read
    app.include_router(
        create_integrations_router(ctx)
    )  # Alertmanager receiver, outbox (agent/api/alertmanager.py)
    app.include_router(histogram_routes(ctx))  # histograms, heap diffs, suspects, attribution
    app.include_router(dashboard_routes())  # the web dashboard at / (agent/api/dashboard.py)
    app.include_router(instances_routes(ctx))  # the instance list, once per tick (agent/api/instances.py)

    def instance_or_404(name: str) -> InstanceState:
        state = ctx.tracker.get(name)
        if state is None:
            known = ", ".join(sorted(ctx.tracker.states)) or "none"
            raise HTTPException(404, f"no instance named {name!r}; known instances: {known}")
        return state

    if ctx.remediation is not None:
        app.include_router(
            remediation_routes(ctx.remediation, guard, instance_or_404)
        )  # plan, restart, pause

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {
            "status": "ok",
            "version": __version__,
            "uptime_seconds": time.time() - ctx.started_at,
            "instances": len(ctx.tracker.states),
            "time_scale": ctx.time_scale,
        }

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        accept, encoding = request.headers.get("accept", ""), request.headers.get("accept-encoding", "")
        pages = ctx.telemetry.pages
        # served from the event loop when this tick's page is built; built in a thread otherwise
        page = pages.peek(accept, encoding)
        if page is None:
            page = await run_in_threadpool(pages.get, accept, encoding)
        body, headers = page
        return Response(body, headers=headers)

    @app.get("/api/v1/instances/{name}")
    def instance(name: str) -> dict[str, Any]:
        now = time.time()
        state = instance_or_404(name)
        with ctx.tracker.lock:
            detail = state.to_dict(now)
            # its server and workers, with what each holds (the list of instances gives only counts)
            detail["processes"] = state.tree.to_list(now) if state.status == "up" else []
        detail["metrics"] = ctx.store.metrics(name)
        detail["events"] = [e.to_dict() for e in ctx.store.events(instance=name, limit=20)]
        return {"now": now, "instance": detail}

    @app.get("/api/v1/instances/{name}/series")
    def series(
        name: str,
        metric: str = Query(..., description="a metric from the catalog, e.g. rss_bytes"),
        since: str | None = Query(None, description="unix time or a duration ago (default 1h)"),
        until: str | None = Query(None, description="unix time or a duration ago (default now)"),
        step: str | None = Query(
            None, description="bucket width, e.g. 30s; raised so at most 2000 points return"
        ),
        agg: str = Query("mean", pattern="^(mean|min|max)$"),
    ) -> dict[str, Any]:
        now = time.time()
        instance_or_404(name)
        stored = ctx.store.metrics(name)
        if metric not in stored and metric not in CATALOG:
            raise HTTPException(
                404, f"unknown metric {metric!r}; this instance has: {', '.join(stored) or 'none'}"
            )
        start = parse_time(since, now, 3600.0)
        end = parse_time(until, now, 0.0)
        if end < start:
            raise HTTPException(400, "until is before since")
        try:
            width = parse_duration(step) if step else None
        except ValueError as exc:
            raise HTTPException(400, f"step: {exc}") from None
        result = ctx.store.series(name, metric, start, end, width, agg, MAX_POINTS, now)  # type: ignore[arg-type]
        return {"now": now, "since": start, "until": end, "agg": agg, **result.to_dict()}

    @app.post("/api/v1/instances/{name}/purge")
    def purge(name: str, body: PurgeRequest | None = None, who: str = Depends(guard)) -> dict[str, Any]:
        body = body or PurgeRequest()
        state = instance_or_404(name)
        with ctx.tracker.lock:
            if state.status != "up" or state.pid is None or state.start_time is None:
                raise HTTPException(
                    409, f"{name} is {state.status} ({state.status_reason}): nothing to purge"
                )
            target = ProbeTarget(state.name, state.pid, state.start_time, state.labels, state.settings)
        try:
            result = purge_instance(target, ctx.events, body.reason, gc=body.gc)
        except ProbeError as exc:
            code = {"unavailable": 409, "permission": 403, "gone": 409}.get(exc.reason, 502)
            raise HTTPException(code, f"purge of {name} failed: {exc}") from None
        return {"instance": name, "purge": result, "by": who}

    @app.get("/api/v1/findings")
    def findings(
        instance: str | None = None,
        kind: str | None = Query(
            None, description="leak, oom-risk, fragmentation, slow, crash-loop, external"
        ),
        state: str = Query("open", pattern="^(open|pending|resolved|all)$"),
        limit: int = Query(500, ge=1, le=10_000),
    ) -> dict[str, Any]:
        if instance is not None:
            instance_or_404(instance)
        found = [] if kind == "external" else ctx.detection.findings(instance, kind, state, limit)
        if kind in (None, "external") and state != "pending":
            found += external_findings(ctx.store, state=None if state == "all" else state, instance=instance)
        return {"now": time.time(), "findings": found[:limit]}

    @app.get("/api/v1/events")
    def events(
        since: str | None = Query(None, description="unix time or a duration ago"),
        after_id: int | None = Query(
            None, ge=0, le=MAX_ID, description="only events after this id, oldest first"
        ),
        instance: str | None = None,
        kind: list[str] = Query(default=[]),
        limit: int = Query(100, ge=1, le=10_000),
    ) -> dict[str, Any]:
        now = time.time()
        start = parse_time(since, now, 0.0) if since else None
        found = ctx.store.events(since=start, after_id=after_id, instance=instance, kinds=kind, limit=limit)
        return {"now": now, "events": [e.to_dict() for e in found]}

    limits = {RECEIVER_PATH: ctx.notify.receiver.max_body + RECEIVER_SLACK}
    app.add_middleware(
        HttpGuard,  # Host check, then body limits and the token check before any body is read
        policies=lambda: route_policies(app.routes, limits, ctx.max_body),
        allowed=ctx.allowed_hosts if ctx.allowed_hosts is not None else allowed_hosts("127.0.0.1"),
        default_max_body=ctx.max_body,
    )
    return app
