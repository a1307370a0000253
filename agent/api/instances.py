"""`GET /api/v1/instances`: every instance's status, newest figures and settings, built once per tick.

The list is the largest answer pollers ask for (3.6 KB an instance: its settings, probe health and
newest figures), so each variant is encoded once per tick (agent/api/snapshots.py) and served as
bytes with an ETag: a client that sends it back in If-None-Match gets 304 until the next tick. The
figures are as of the answer's `now`, when it was built: at most one probe interval ago.

`fields` keeps only some fields of each instance (`name` always comes along); `limit` and `after`
page through the list in name order, `next` naming the `after` of the following page (null on the
last one).
"""

from __future__ import annotations

import hashlib
import time
from functools import cache
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response
from pydantic import TypeAdapter

from agent.api.snapshots import TickCache
from agent.config.model import InstanceSpec
from agent.watch.instances import InstanceState

VARIANTS = 16  # field selections and pages kept per tick: each client's own, a few at a time
MAX_NAME = 256  # `after`: an instance name, as long as any


@cache
def instance_fields() -> tuple[str, ...]:
    """The fields of an instance's JSON, in their order (whatever `InstanceState.to_dict` writes)."""
    spec = InstanceSpec.model_validate({"name": "x", "match": {"pid": 1}})
    return tuple(InstanceState("x", spec).to_dict(0.0))


@cache
def _json() -> TypeAdapter[dict[str, Any]]:
    """The JSON FastAPI writes for a route that returns `dict[str, Any]`, as this one did, byte for byte
    (pydantic's serializer: a NaN becomes null)."""
    return TypeAdapter(dict[str, Any])


def parse_fields(text: str | None) -> frozenset[str] | None:
    """`fields=name,status,…` as a set of known fields; None keeps every field."""
    if text is None:
        return None
    known = instance_fields()
    wanted = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(wanted - set(known))
    if unknown:
        shown = ", ".join(repr(name[:40]) for name in unknown[:5])
        raise HTTPException(400, f"fields: unknown field(s) {shown}; an instance has: {', '.join(known)}")
    return wanted | {"name"}


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an If-None-Match header names `etag` (weakly, as RFC 9110 compares for it) or is `*`."""
    if not if_none_match:
        return False
    tags = (tag.strip() for tag in if_none_match.split(","))
    return any(tag == "*" or tag.removeprefix("W/") == etag for tag in tags)


def instances_routes(ctx: Any) -> APIRouter:
    """The instance list, for `create_app` (`ctx` is its `ApiContext`)."""
    router = APIRouter()
    built: TickCache[tuple[bytes, str]] = TickCache(ctx.telemetry.ticks, ctx.telemetry.max_age, VARIANTS)

    def build(fields: frozenset[str] | None, after: str | None, limit: int | None) -> tuple[bytes, str]:
        now = time.time()
        instances = ctx.tracker.snapshot(now)
        if after is not None:
            instances = [inst for inst in instances if inst["name"] > after]
        page = instances[:limit] if limit is not None else instances
        if fields is not None:
            page = [{key: value for key, value in inst.items() if key in fields} for inst in page]
        # time_scale rides along so the dashboard can say plainly when time is compressed
        body: dict[str, Any] = {"now": now, "time_scale": ctx.time_scale, "instances": page}
        if limit is not None:
            body["next"] = page[-1]["name"] if len(instances) > limit else None
        data = _json().dump_json(body)
        return data, f'"{hashlib.blake2b(data, digest_size=12).hexdigest()}"'

    @router.get("/api/v1/instances")
    def instances(
        request: Request,
        fields: str | None = Query(
            None, max_length=4096, description="fields of each instance, e.g. name,status,memory_bytes"
        ),
        limit: int | None = Query(None, ge=1, le=10_000, description="at most this many instances"),
        after: str | None = Query(
            None,
            max_length=MAX_NAME,
            description="only instances named after this one (the last page's next)",
        ),
    ) -> Response:
        wanted = parse_fields(fields)
        key = (wanted, after, limit)
        data, etag = built.get(key, lambda: build(wanted, after, limit))
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if etag_matches(request.headers.get("if-none-match"), etag):
            return Response(status_code=304, headers=headers)
        return Response(data, media_type="application/json", headers=headers)

    return router
