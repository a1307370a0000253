"""The histogram part of the JSON API: snapshots, diffs, heap diffs, suspects and memory attribution.

    GET /api/v1/instances/{name}/histograms           snapshots in a window, and the latest one's top rows
    GET /api/v1/instances/{name}/histograms/diff      ?from=1h&to=… (or from_id/to_id), kind=class|type|container|nmt
    GET /api/v1/instances/{name}/heap/diff            the same over native allocation sites
    GET /api/v1/instances/{name}/suspects             ?since=6h: what grows, ranked
    GET /api/v1/instances/{name}/attribution          ?since=6h: RSS split into layers, where it grows

Times are unix timestamps or durations ago (`15m`); a time picks the snapshot at or before it.
A diff without `kind` compares the kind the instance has (a JVM's classes, a Python process's types).
Before there are two snapshots to compare, a diff answers 200 with no rows and `pending`, the reason:
no data yet is not an error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query

from agent.api.context import ApiContext
from agent.api.query import parse_time
from agent.core.errors import ProbeError
from agent.core.histograms import Snapshot
from agent.detect.explain.attribution import attribution_for
from agent.detect.explain.histodiff import diff
from agent.detect.explain.ranking import suspects_for
from agent.detect.explain.retainers import with_held_by
from agent.detect.explain.suspects import SUSPECT_KINDS
from agent.state.histograms import HistogramStore

KIND_PATTERN = "^(class|type|container|site|nmt|retainer)$"
SUSPECT_PATTERN = "^(class|type|container|site|nmt)$"  # retainers name holders, not what grows
DEFAULT_WINDOW = 6 * 3600.0
MAX_ID = 2**63 - 1  # SQLite's INTEGER: a larger id would fail in the query, not answer 404
PROBE_OF_KIND = {
    "class": "jvm",
    "nmt": "jvm",
    "retainer": "jvm",
    "type": "pyhist",
    "container": "pyhist",
    "site": "heapprof",
}


class NotYet(Exception):
    """Not two snapshots to compare yet; its message says why and what brings them."""


@dataclass(frozen=True, slots=True)
class DiffRange:
    """The two snapshots a diff compares (by time or by id) and how many rows it returns."""

    start: str | None
    end: str | None
    from_id: int | None
    to_id: int | None
    top: int


def diff_range(
    from_: str | None = Query(None, alias="from", description="unix time or a duration ago (default 1h)"),
    to: str | None = Query(None, description="unix time or a duration ago (default: the latest)"),
    from_id: int | None = Query(None, ge=1, le=MAX_ID),
    to_id: int | None = Query(None, ge=1, le=MAX_ID),
    top: int = Query(50, ge=1, le=1000),
) -> DiffRange:
    """The query parameters every diff route takes, read once for all of them."""
    return DiffRange(from_, to, from_id, to_id, top)


def histogram_routes(ctx: ApiContext) -> APIRouter:
    """Routes over `ctx.store` (an `agent.state.store.Store`) and `ctx.tracker` (for instance names)."""
    router = APIRouter()
    histos = HistogramStore(ctx.store)

    def known(name: str) -> None:
        if ctx.tracker.get(name) is None and not histos.snapshots(name, 0.0, time.time() + 86400, limit=1):
            names = ", ".join(sorted(ctx.tracker.states)) or "none"
            raise HTTPException(404, f"no instance named {name!r}; known instances: {names}")

    def pick(
        name: str, kind: str, when: str | None, snapshot_id: int | None, now: float, default_ago: float
    ) -> Snapshot:
        if snapshot_id is not None:
            found = histos.load(snapshot_id)
            if found is None or found.instance != name or found.kind != kind:
                raise HTTPException(404, f"no {kind} snapshot {snapshot_id} of {name}")
            return found
        found = histos.nearest(name, kind, parse_time(when, now, default_ago))
        if found is None:
            raise NotYet(f"no {kind} histograms of {name} yet: {why_none(name, kind)}")
        return found

    def why_none(name: str, kind: str) -> str:
        """The probe's own reason when it has one (unavailable, last error), else how to get snapshots."""
        state = ctx.tracker.get(name)
        health = getattr(state, "probes", {}).get(PROBE_OF_KIND[kind]) if state is not None else None
        reason = health and (health.unavailable or health.last_error)
        return f"the {PROBE_OF_KIND[kind]} probe says: {reason}" if reason else _howto(kind)

    def object_kind(name: str, now: float) -> str:
        """The histogram kind of `name`'s objects: the kind of its newest snapshot, else `class` for a
        JVM and `type` for anything else (a Python process, or one that is not running)."""
        newest = [s for s in (histos.nearest(name, k, now) for k in ("class", "type")) if s is not None]
        if newest:
            return max(newest, key=lambda s: s.ts).kind
        from probes.jcmd import is_jvm  # loaded by the first such diff: an agent without JVMs need not

        state = ctx.tracker.get(name)
        pid = getattr(state, "pid", None)
        try:
            return "class" if isinstance(pid, int) and is_jvm(pid) else "type"
        except ProbeError:  # gone, or not ours to read
            return "type"

    def diff_body(name: str, kind: str | None, span: DiffRange) -> dict[str, Any]:
        now = time.time()
        known(name)
        kind = kind or object_kind(name, now)
        try:
            return {"now": now, "instance": name, "kind": kind, **compare(name, kind, span, now)}
        except NotYet as exc:
            return {"now": now, "instance": name, "kind": kind, "rows": [], "pending": str(exc)}

    def compare(name: str, kind: str, span: DiffRange, now: float) -> dict[str, Any]:
        before = pick(name, kind, span.start, span.from_id, now, 3600.0)
        after = pick(name, kind, span.end, span.to_id, now, 0.0)
        if before.id == after.id:
            older = histos.snapshots(name, 0.0, after.ts, kind, after.source, limit=2)
            if len(older) < 2:
                raise NotYet(f"only one {kind} snapshot of {name} so far: {_next_one(kind)}")
            before = histos.load(older[0].id or 0) or before
        if after.ts < before.ts:
            before, after = after, before
        return diff(before, after).to_dict(span.top)

    @router.get("/api/v1/instances/{name}/histograms")
    def histograms(
        name: str,
        kind: str | None = Query(None, pattern=KIND_PATTERN),
        source: str | None = None,
        since: str | None = Query(None, description="unix time or a duration ago (default 6h)"),
        until: str | None = None,
        top: int = Query(20, ge=1, le=1000),
        limit: int = Query(200, ge=1, le=5000),
    ) -> dict[str, Any]:
        now = time.time()
        known(name)
        start, end = parse_time(since, now, DEFAULT_WINDOW), parse_time(until, now, 0.0)
        found = histos.snapshots(name, start, end, kind, source, limit)
        latest = {}
        for snapshot in reversed(found):
            if snapshot.kind not in latest and snapshot.id is not None:
                loaded = histos.load(snapshot.id)
                if loaded is not None:
                    latest[snapshot.kind] = loaded.to_dict(top)
        return {
            "now": now,
            "instance": name,
            "since": start,
            "until": end,
            "snapshots": [s.info() for s in found],
            "latest": latest,
        }

    @router.get("/api/v1/instances/{name}/histograms/diff")
    def histogram_diff(
        name: str,
        kind: str | None = Query(None, pattern=KIND_PATTERN, description="default: the instance's kind"),
        span: DiffRange = Depends(diff_range),
    ) -> dict[str, Any]:
        return diff_body(name, kind, span)

    @router.get("/api/v1/instances/{name}/heap/diff")
    def heap_diff(name: str, span: DiffRange = Depends(diff_range)) -> dict[str, Any]:
        return diff_body(name, "site", span)

    @router.get("/api/v1/instances/{name}/suspects")
    def suspects(
        name: str,
        since: str | None = Query(None, description="unix time or a duration ago (default 6h)"),
        kind: str | None = Query(None, pattern=SUSPECT_PATTERN),
        limit: int = Query(10, ge=1, le=200),
    ) -> dict[str, Any]:
        now = time.time()
        known(name)
        start = parse_time(since, now, DEFAULT_WINDOW)
        kinds = (kind,) if kind else SUSPECT_KINDS
        found = with_held_by(
            ctx.store, name, start, now, suspects_for(ctx.store, name, start, now, kinds=kinds, limit=limit)
        )
        return {"now": now, "instance": name, "since": start, "suspects": [s.to_dict() for s in found]}

    @router.get("/api/v1/instances/{name}/attribution")
    def attribution(
        name: str, since: str | None = Query(None, description="unix time or a duration ago (default 6h)")
    ) -> dict[str, Any]:
        now = time.time()
        known(name)
        start = parse_time(since, now, DEFAULT_WINDOW)
        return {"now": now, **attribution_for(ctx.store, name, start, now).to_dict()}

    return router


def _next_one(kind: str) -> str:
    return {
        "class": "the next comes after histograms.jvm.interval",
        "type": "the next comes after histograms.python.interval",
        "site": "the next comes after histograms.heap_profiles.interval",
        "nmt": "the next comes after histograms.jvm.heap_interval",
    }[kind]


def _howto(kind: str) -> str:
    return {
        "class": "JVM targets get class histograms from the jvm probe every histograms.jvm.interval",
        "type": "Python targets need the in-process hook (docs/allocators.md) for type histograms",
        "container": "Python targets need the in-process hook (docs/allocators.md) for named containers",
        "site": "configure histograms.heap_profiles with a directory (docs/histograms.md)",
        "nmt": "start the JVM with -XX:NativeMemoryTracking=summary",
        "retainer": "the jvm probe records what holds a JVM's leak when a leak finding opens on it",
    }[kind]
