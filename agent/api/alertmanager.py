"""`POST /api/v1/alertmanager`: Alertmanager's webhook in; firing alerts become `external` findings.

Point an Alertmanager `webhook_config` at it (docs/alerts.md). The request must carry the admin
token (`Authorization: Bearer …`, Alertmanager's `http_config.authorization`) or an HMAC
signature (`X-Medic-Timestamp` + `X-Medic-Signature`, with `notify.receiver.secret_env|file`).
Checks, in order, each with its own 4xx: credentials present and the token right (401/403, before
the body is read: the connection is then closed), body size (413), the HMAC signature (403), JSON
nesting at most 32 deep and syntax (400), payload version 4 and field types (400), alerts per
payload (413); then each alert is mapped to an instance by `notify.receiver.instance_labels`.
Firing alerts open findings, resolved ones resolve them; repeated deliveries change nothing
(idempotent on the alert fingerprint). A
payload of which no alert names a watched instance is refused with 422, so that a misrouted
Alertmanager shows up in its own logs.

`create_router(ctx)` also mounts `GET /api/v1/outbox` (`agent.api.outbox`).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from agent.api.context import ApiContext
from agent.api.guard import MAX_JSON_DEPTH, content_length, json_too_deep
from agent.api.outbox import outbox_routes
from agent.notify.external import ExternalAlert, open_external_finding, resolve_external_finding
from agent.notify.inbound import AmWebhook, InboundAlert, InboundError, ignored, map_instance, parse_webhook
from agent.notify.metrics import ReceiverCollector
from agent.notify.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, SignatureError, verify

PATH = "/api/v1/alertmanager"


async def read_limited(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it exceeds `limit` bytes (before reading it when the length is known)."""
    length = request.headers.get("content-length")
    if length is not None:
        size = content_length(length)
        if size is None:
            raise InboundError(400, f"invalid Content-Length {length[:20]!r}")
        if size > limit:
            raise InboundError(
                413, f"the body has {size} bytes, more than the {limit} allowed (notify.receiver.max_body)"
            )
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise InboundError(
                    413, f"the body exceeds the {limit} bytes allowed (notify.receiver.max_body)"
                )
            chunks.append(chunk)
    except ClientDisconnect:  # a sender that gave up or was cut off: its payload is refused, not a bug
        raise InboundError(
            400, f"the client closed the connection after {size} bytes, before the whole JSON payload"
        ) from None
    return b"".join(chunks)


def authenticate(
    headers: Any, body: bytes | None, token: str, secret: str | None, tolerance: float, now: float
) -> None:
    """Admin token or HMAC signature; InboundError 401 (missing) or 403 (wrong).

    With `body` None (not read yet) everything but the signature itself is checked."""
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and given.strip():
        if not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise InboundError(403, "wrong admin token")
        return
    if headers.get(TIMESTAMP_HEADER) or headers.get(SIGNATURE_HEADER):
        if secret is None:
            raise InboundError(
                401,
                "HMAC signatures are not enabled here (notify.receiver.secret_env|secret_file); use the admin token",
            )
        if body is None:
            return
        try:
            verify(secret, headers.get(TIMESTAMP_HEADER), headers.get(SIGNATURE_HEADER), body, now, tolerance)
        except SignatureError as exc:
            raise InboundError(403, f"bad signature: {exc}") from None
        return
    raise InboundError(
        401,
        "send the admin token (`Authorization: Bearer <token>`; in Alertmanager: http_config.authorization."
        "credentials_file) or an HMAC signature",
    )


def apply_alerts(
    ctx: ApiContext, payload: AmWebhook, alerts: list[InboundAlert], now: float
) -> tuple[int, dict[str, Any]]:
    """Open or resolve findings for the alerts; the HTTP status and the answer body."""
    spec = ctx.notify.receiver
    with ctx.tracker.lock:
        known = set(ctx.tracker.states)
    results = []
    for alert in alerts:
        entry: dict[str, Any] = {
            "fingerprint": alert.fingerprint,
            "alertname": alert.alertname,
            "status": alert.status,
        }
        if ignored(alert.labels, spec.ignore_labels):
            results.append(
                {**entry, "result": "ignored", "reason": f"carries {spec.ignore_labels} (medic's own alert)"}
            )
            continue
        other = alert.labels.get("agent")
        if ctx.agent_name and other and other != ctx.agent_name:  # a replica's: never this one's to repair
            results.append(
                {**entry, "result": "other-agent", "reason": f"about agent {other}, not {ctx.agent_name}"}
            )
            continue
        instance = map_instance(alert.labels, known, spec.instance_labels)
        if instance is None:
            results.append(
                {
                    **entry,
                    "result": "unknown-instance",
                    "reason": _unknown(alert, spec.instance_labels, known),
                }
            )
            continue
        entry["instance"] = instance
        if alert.status == "firing":
            external = ExternalAlert(
                instance=instance,
                fingerprint=alert.fingerprint,
                alertname=alert.alertname,
                severity=alert.severity,
                summary=alert.summary,
                starts_at=alert.starts_at,
                evidence={
                    "labels": alert.labels,
                    "annotations": alert.annotations,
                    "generator_url": alert.generator_url,
                    "starts_at": alert.starts_at,
                    "receiver": payload.receiver,
                    "external_url": payload.externalURL,
                    "group_key": payload.groupKey,
                },
            )
            finding, opened = open_external_finding(ctx.store, ctx.events, external, now)
            results.append(
                {**entry, "result": "opened" if opened else "duplicate", "finding_id": finding["id"]}
            )
        else:
            reason = f"Alertmanager reports {alert.alertname} resolved"
            resolved = resolve_external_finding(
                ctx.store, ctx.events, instance, alert.fingerprint, reason, now
            )
            results.append(
                {
                    **entry,
                    "result": "resolved" if resolved else "not-open",
                    "finding_id": resolved and resolved["id"],
                }
            )
    unknown = [r for r in results if r["result"] == "unknown-instance"]
    body = {"received": len(alerts), "results": results}
    if alerts and len(unknown) == len(alerts):
        return 422, {"error": f"no alert names a watched instance: {unknown[0]['reason']}", **body}
    return 200, body


def _unknown(alert: InboundAlert, labels: list[str], known: set[str]) -> str:
    present = {name: alert.labels[name] for name in labels if name in alert.labels}
    names = ", ".join(sorted(known)[:20]) or "none"
    return (
        f"none of the labels {', '.join(labels)} names a watched instance (alert has {present or 'none of them'}; "
        f"watched: {names}); set notify.receiver.instance_labels or fix the alert's labels"
    )


def create_router(ctx: ApiContext) -> APIRouter:
    """The integration endpoints, for `create_app`: the Alertmanager receiver and the outbox view."""
    spec = ctx.notify.receiver
    secret = spec.secret("notify.receiver")
    stats = ReceiverCollector()
    ctx.telemetry.registry.register(stats)
    router = APIRouter()
    router.include_router(outbox_routes(ctx))
    if not spec.enabled:
        return router

    @router.post(PATH)
    async def alertmanager(request: Request) -> JSONResponse:
        now = time.time()
        body = None
        try:
            authenticate(request.headers, None, ctx.token, secret, spec.signature_tolerance, now)
            body = await read_limited(request, spec.max_body)
            authenticate(request.headers, body, ctx.token, secret, spec.signature_tolerance, now)
            if json_too_deep(body, MAX_JSON_DEPTH):
                raise InboundError(
                    400,
                    f"the JSON nests deeper than {MAX_JSON_DEPTH} levels; send Alertmanager's webhook payload",
                )
            payload, alerts = parse_webhook(body, spec.max_alerts)
        except InboundError as exc:
            stats.count("rejected", _reason(exc))
            unread = body is None  # refused before (or while) reading: do not read the rest
            return JSONResponse(
                {"error": str(exc)},
                status_code=exc.status,
                headers={"Connection": "close"} if unread else None,
            )
        status, answer = await asyncio.to_thread(apply_alerts, ctx, payload, alerts, now)
        for result in answer["results"]:
            stats.count("alerts", result["result"])
        if status != 200:
            stats.count("rejected", "instance")
        return JSONResponse(answer, status_code=status)

    return router


def _reason(exc: InboundError) -> str:
    if exc.status in (401, 403, 413):
        return "size" if exc.status == 413 else "auth"
    return "json" if "JSON" in str(exc) or "UTF-8" in str(exc) else "schema"
