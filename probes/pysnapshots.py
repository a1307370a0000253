"""Snapshots made from the Python hook's replies: types (`python`), named containers (`containers`) and
allocation sites (`tracemalloc`). Whatever a reply holds, the snapshot is sane: malformed rows are
skipped, figures are finite and not negative, text is cut to a bounded length; a hook older or newer
than medic (fields missing or added) gives what it has.
"""

from __future__ import annotations

from typing import Any

from agent.core.figures import is_figure
from agent.core.histograms import HistogramRow, Snapshot, rows_from
from agent.core.records import ProbeTarget

MAX_CONTAINERS = 32
MAX_HOLDERS = 16
_TEXT = 300  # characters kept of a name or a line


def _text(value: Any) -> str | None:
    return value[:_TEXT] if isinstance(value, str) and value else None


def _texts(value: Any, keep: int) -> list[str]:
    return [item[:_TEXT] for item in value if isinstance(item, str)][:keep] if isinstance(value, list) else []


def _figure(value: Any) -> float | None:
    return float(value) if is_figure(value) else None


def container_of(item: dict[str, Any]) -> dict[str, Any]:
    """One entry of a reply's `containers`, each field checked (None when missing or malformed)."""
    return {
        "name": _text(item.get("name")),
        "type": _text(item.get("type")),
        "len": _figure(item.get("len")),
        "bytes": _figure(item.get("bytes")),
        "content_bytes": _figure(item.get("content_bytes")),
        "holds": _text(item.get("holds")),
        "kinds": _texts(item.get("kinds"), 4),
        "complete": item.get("complete") is not False,
        "sampled": _figure(item.get("sampled")),
    }


def holder_of(item: dict[str, Any]) -> dict[str, Any]:
    """One entry of a `sites` reply's `holders`, each field checked."""
    return {
        "name": _text(item.get("name")),
        "type": _text(item.get("type")),
        "len": _figure(item.get("len")),
        "holds": _text(item.get("holds")),
        "sites": _texts(item.get("sites"), 4),
        "added_at": _text(item.get("added_at")),
        "traceback": _texts(item.get("traceback"), 25),
        "by": item.get("by") if item.get("by") in ("table", "entry") else None,
    }


def _dicts(value: Any, keep: int) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)][:keep] if isinstance(value, list) else []


def snapshot_from_reply(target: ProbeTarget, now: float, reply: dict[str, Any]) -> Snapshot:
    """A `python` snapshot from a `histogram` reply; malformed rows are skipped.

    Totals: the object count is the hook's; bytes are the sum over the returned (top) types.
    """
    rows = []
    for item in reply.get("types") or []:
        if not isinstance(item, dict):
            continue
        name, count, size = item.get("type"), _figure(item.get("count")), _figure(item.get("bytes"))
        if isinstance(name, str) and count is not None and size is not None:
            rows.append((name, count, size))
    merged = rows_from(rows)
    objects = _figure(reply.get("objects"))
    total_count = objects if objects is not None else sum(r.count for r in merged)
    distinct = _figure(reply.get("distinct_types"))
    fraction = _figure(reply.get("sample_fraction"))
    meta = {
        "elapsed_s": _figure(reply.get("elapsed_s")),
        "cpu_s": _figure(reply.get("cpu_s")),
        "referents": reply.get("referents") is True,
        "containers": [container_of(item) for item in _dicts(reply.get("containers"), MAX_CONTAINERS)],
        "sites_tracing": reply.get("sites_tracing") is True,
        # the walk sampled the heap (1.0: every tracked object was walked)
        "sample_fraction": None if fraction is None else min(fraction, 1.0),
        # the hook's budgets cut its count of the largest containers short: a partial figure
        "partial": reply.get("contents_complete") is False,
    }
    return Snapshot(
        target.instance,
        "python",
        now,
        merged,
        total_count,
        sum(r.bytes for r in merged),
        target.pid,
        target.start_time,
        int(distinct) if distinct is not None else len(merged),
        meta,
    )


def containers_snapshot_from_reply(target: ProbeTarget, now: float, reply: dict[str, Any]) -> Snapshot | None:
    """A `containers` snapshot (kind `container`) from a `histogram` reply: one row per container named
    by where it lives, its length as count, itself and what it holds as bytes, `type holds` as detail;
    None when the reply names none (an older hook)."""
    rows: dict[str, HistogramRow] = {}
    partial = False
    for item in _dicts(reply.get("containers"), MAX_CONTAINERS):
        found = container_of(item)
        name, count = found["name"], found["len"]
        if name is None or count is None or name in rows:
            continue
        partial = partial or not found["complete"]
        size = (found["bytes"] or 0.0) + (found["content_bytes"] or 0.0)
        detail = " ".join(part for part in (found["type"], found["holds"]) if part) or None
        rows[name] = HistogramRow(name, count, size, detail)
    if not rows:
        return None
    return Snapshot(
        target.instance,
        "containers",
        now,
        list(rows.values()),
        sum(r.count for r in rows.values()),
        sum(r.bytes for r in rows.values()),
        target.pid,
        target.start_time,
        len(rows),
        {"partial": partial or reply.get("contents_complete") is False},
    )


def sites_snapshot_from_reply(target: ProbeTarget, now: float, reply: dict[str, Any]) -> Snapshot:
    """A `tracemalloc` snapshot (kind `site`) from a `sites` reply: one row per `file:line`, with the
    heaviest call path to it (innermost first) as its detail, and the containers holding what the
    session allocated in `meta.holders`; malformed rows are skipped."""
    rows = []
    for item in reply.get("sites") or []:
        if not isinstance(item, dict):
            continue
        name, count, size, stack = (
            item.get("site"),
            _figure(item.get("count")),
            _figure(item.get("bytes")),
            item.get("traceback"),
        )
        if not isinstance(name, str) or count is None or size is None:
            continue
        frames = [f for f in stack if isinstance(f, str)] if isinstance(stack, list) else []
        rows.append(HistogramRow(name[:1000], count, size, " ← ".join(frames)[:2000] or None))
    total_bytes, total_count = _figure(reply.get("total_bytes")), _figure(reply.get("total_count"))
    distinct = _figure(reply.get("distinct_sites"))
    meta: dict[str, Any] = {
        key: reply.get(key)
        for key in (
            "frames",
            "traced_bytes",
            "tracemalloc_bytes",
            "max_memory",
            "remaining_s",
            "elapsed_s",
            "owned",
            "started_at",
        )
        if is_figure(reply.get(key)) or isinstance(reply.get(key), bool)
    }
    meta["holders"] = [holder_of(item) for item in _dicts(reply.get("holders"), MAX_HOLDERS)]
    return Snapshot(
        target.instance,
        "tracemalloc",
        now,
        rows,
        total_count if total_count is not None else sum(r.count for r in rows),
        total_bytes if total_bytes is not None else sum(r.bytes for r in rows),
        target.pid,
        target.start_time,
        int(distinct) if distinct is not None else len(rows),
        meta,
    )
