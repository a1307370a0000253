"""`GET /api/v1/instances`: every instance's status, newest figures and settings, built once per tick.

The list is the largest answer pollers ask for (3.6 KB an instance: its settings, probe health and
newest figures), so each variant is encoded once per tick (agent/api/snapshots.py) and served as
bytes (gzipped, 20 times smaller, for a client that accepts gzip) with an ETag: a client that sends
it back in If-None-Match gets 304 until the next tick. The
figures are as of the answer's `now`, when it was built: at most one probe interval ago.

`fields` keeps only some fields of each instance (`name` always comes along); `limit` and `after`
page through the list in name order, `next` naming the `after` of the following page (null on the
last one).
"""

from __future__ import annotations

import gzip
import hashlib
import time
from functools import cache
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response
from prometheus_client.exposition import gzip_accepted
from pydantic import TypeAdapter
from starlette.concurrency import run_in_threadpool

from agent.api.context import ApiContext
from agent.api.snapshots import TickCache
from agent.config.model import InstanceSpec
from agent.watch.instances import InstanceState

VARIANTS = 8  # field selections and pages kept per tick: each client's own, a few at a time
BUDGET = 4 * 2**20  # bytes of answers kept (the newest always): 5 whole lists of 200 instances
GZIP_LEVEL = 6  # the list of 200 instances: 776 KB, 39 KB gzipped, 5 ms once per tick
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


def instances_routes(ctx: ApiContext) -> APIRouter:
    """The instance list, for `create_app` (`ctx` is its `ApiContext`)."""
    router = APIRouter()
    built: TickCache[tuple[bytes, str]] = TickCache(
        ctx.telemetry.ticks, ctx.telemetry.max_age, VARIANTS, BUDGET, lambda answer: len(answer[0])
    )

    def build(
        fields: frozenset[str] | None, after: str | None, limit: int | None, compressed: bool
    ) -> tuple[bytes, str]:
        """The answer's JSON, each instance encoded as soon as it is described: the answer's peak is
        its bytes and one instance's dict, not every instance's dict at once."""
        dump = _json().dump_json
        now = time.time()
        chunks: list[bytes] = []
        more, last = False, None
        with ctx.tracker.lock:  # every instance as of the same moment
            for state in sorted(ctx.tracker.states.values(), key=lambda s: s.name):
                if after is not None and state.name <= after:
                    continue
                if limit is not None and len(chunks) == limit:
                    more = True
                    break
                inst = state.to_dict(now)
                chunks.append(
                    dump(inst if fields is None else {k: v for k, v in inst.items() if k in fields})
                )
                last = state.name
        # time_scale rides along so the dashboard can say plainly when time is compressed
        head = dump({"now": now, "time_scale": ctx.time_scale})[:-1] + b',"instances":['
        tail = b"]}" if limit is None else b"]," + dump({"next": last if more else None})[1:]
        data = head + b",".join(chunks) + tail
        if compressed:
            data = gzip.compress(data, GZIP_LEVEL)
        return data, f'"{hashlib.blake2b(data, digest_size=12).hexdigest()}"'

    @router.get("/api/v1/instances")
    async def instances(
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
        compressed = gzip_accepted(request.headers.get("accept-encoding", ""))
        key = (wanted, after, limit, compressed)
        # served from the event loop when this tick's answer is built; built in a thread otherwise
        answer = built.peek(key)
        if answer is None:
            answer = await run_in_threadpool(built.get, key, lambda: build(wanted, after, limit, compressed))
        data, etag = answer
        headers = {"ETag": etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding"}
        if etag_matches(request.headers.get("if-none-match"), etag):
            return Response(status_code=304, headers=headers)
        if compressed:
            headers["Content-Encoding"] = "gzip"
        return Response(data, media_type="application/json", headers=headers)

    return router
