"""The hook's operations, one handler per op, and `handle_line`, which turns every failure into an
error reply so that nothing raises into the host.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from medic_hook import sites
from medic_hook.allocator import local_allocator, process_memory, rss_bytes
from medic_hook.errors import AllocatorError, RequestError
from medic_hook.histogram import DEFAULT_CONTENTS, MAX_OBJECTS, type_histogram
from medic_hook.protocol import (
    OPS,
    PROTOCOL_VERSION,
    decode_request,
    error_reply,
    optional_float,
    optional_int,
    require_bool,
    require_str,
)

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def _common(op: str) -> dict[str, Any]:
    return {
        "ok": True,
        "op": op,
        "hook": "python",
        "protocol": PROTOCOL_VERSION,
        "pid": os.getpid(),
        "ts": round(time.time(), 3),
    }


def op_ping(request: dict[str, Any]) -> dict[str, Any]:
    return {**_common("ping"), "pong": True, "allocator": local_allocator().name, "ops": list(OPS)}


def _python_figures() -> dict[str, Any]:
    import gc

    blocks = sys.getallocatedblocks()
    return {
        "version": sys.version.split()[0],
        "pymalloc": blocks > 0,
        "pymalloc_allocated_blocks": blocks,
        "pythonmalloc": os.environ.get("PYTHONMALLOC"),
        "gc_counts": list(gc.get_count()),
        "gc_collections": [generation["collections"] for generation in gc.get_stats()],
        "threads": threading.active_count(),
    }


def op_stats(request: dict[str, Any]) -> dict[str, Any]:
    detail = request.get("detail", False) is True
    allocator = local_allocator()
    return {
        **_common("stats"),
        **allocator.describe(),
        **allocator.stats(detail=detail),
        "process": process_memory(),
        "python": _python_figures(),
    }


def op_purge(request: dict[str, Any]) -> dict[str, Any]:
    import gc

    allocator = local_allocator()
    started, before = time.perf_counter(), rss_bytes()
    collected = gc.collect() if request.get("gc") is True else None
    action = allocator.purge()
    after = rss_bytes()
    return {
        **_common("purge"),
        "allocator": allocator.name,
        "action": action,
        "gc_collected": collected,
        "rss_before": before,
        "rss_after": after,
        "returned_bytes": max(0, before - after),
        "duration_s": round(time.perf_counter() - started, 6),
    }


def op_prof_dump(request: dict[str, Any]) -> dict[str, Any]:
    path = require_str(request, "path", absolute_path=True)
    allocator = local_allocator()
    result = allocator.prof_dump(path)
    return {
        **_common("prof_dump"),
        "allocator": allocator.name,
        "path": path,
        "bytes": os.path.getsize(path),
        **result,
    }


def op_prof_active(request: dict[str, Any]) -> dict[str, Any]:
    active = require_bool(request, "active")
    prefix = request.get("prefix")
    if prefix is not None:
        prefix = require_str(request, "prefix", absolute_path=True)
    allocator = local_allocator()
    return {**_common("prof_active"), "allocator": allocator.name, **allocator.prof_active(active, prefix)}


def op_histogram(request: dict[str, Any]) -> dict[str, Any]:
    result = type_histogram(
        top=optional_int(request, "top", 50, 1, 1000),
        max_objects=optional_int(request, "max_objects", MAX_OBJECTS, 1, MAX_OBJECTS)
        if "max_objects" in request
        else None,
        budget_s=optional_float(request, "budget_s", 1.0, 0.001, 10.0),
        referents=request.get("referents", False) is True,
        contents=optional_int(request, "contents", DEFAULT_CONTENTS, 0, 64),
        wall_s=optional_float(request, "wall_s", 1.0, 0.001, 60.0) if "wall_s" in request else None,
    )
    return {**_common("histogram"), **result, "sites_tracing": sites.tracing()}


def op_sites_start(request: dict[str, Any]) -> dict[str, Any]:
    result = sites.start(
        frames=optional_int(request, "frames", sites.DEFAULT_FRAMES, 1, sites.MAX_FRAMES),
        duration_s=optional_float(request, "duration_s", sites.DEFAULT_DURATION_S, 1.0, sites.MAX_DURATION_S),
        max_memory=optional_int(request, "max_memory", sites.DEFAULT_MAX_MEMORY, 2**20, sites.MAX_MEMORY),
    )
    return {**_common("sites_start"), **result}


def op_sites(request: dict[str, Any]) -> dict[str, Any]:
    top = optional_int(request, "top", 50, 1, 500)
    return {**_common("sites"), **sites.snapshot(top=top, holders=request.get("holders", True) is not False)}


def op_sites_stop(request: dict[str, Any]) -> dict[str, Any]:
    return {**_common("sites_stop"), **sites.stop()}


HANDLERS: dict[str, Handler] = {
    "ping": op_ping,
    "stats": op_stats,
    "purge": op_purge,
    "prof_dump": op_prof_dump,
    "prof_active": op_prof_active,
    "histogram": op_histogram,
    "sites_start": op_sites_start,
    "sites": op_sites,
    "sites_stop": op_sites_stop,
}


def handle_line(line: bytes, handlers: dict[str, Handler] = HANDLERS) -> dict[str, Any]:
    """The reply to one request line; never raises (every failure is an error reply)."""
    try:
        request = decode_request(line)
        handler = handlers.get(request["op"])
        if handler is None:
            known = ", ".join(handlers)
            return error_reply("unknown_op", f"unknown op {request['op'][:64]!r}: known ops are {known}")
        return handler(request)
    except RequestError as exc:
        return error_reply(exc.code, str(exc))
    except AllocatorError as exc:
        return error_reply("failed", str(exc))
    except OSError as exc:
        return error_reply("failed", f"{exc.strerror or exc} ({getattr(exc, 'filename', None) or ''})")
    except Exception as exc:
        return error_reply("failed", f"{type(exc).__name__}: {str(exc)[:300]}")
