"""The hook protocol as medic (the client side) sees it: one JSON object per line each way, over a Unix
stream socket.

Requests: `{"op": "ping" | "stats" | "purge" | "prof_dump" | "prof_active" | "histogram" | "sites_start" |
"sites" | "sites_stop", ...}` (the last four are the Python hook's only).
Replies: `{"ok": true, "op": ..., ...}` or `{"ok": false, "code": CODE, "error": "what and what to do"}`.
The rules (limits, ops, error codes, request parsing) live in `medic_hook.protocol`, part of the
package that runs inside Python targets; this module re-exports them and adds the reading of replies.
The C shim (`shim.c`) implements the same rules; `tests/test_hook_contract.py` runs one suite on both
hooks.
"""

from __future__ import annotations

import json
from typing import Any

from medic_hook.errors import RequestError
from medic_hook.protocol import (
    ERROR_CODES,
    MAX_REPLY_BYTES,
    MAX_REQUEST_BYTES,
    OPS,
    PROTOCOL_VERSION,
    SHIM_OPS,
    decode_request,
    encode,
    error_reply,
    optional_float,
    optional_int,
    require_bool,
    require_str,
)
from native_hooks.errors import HookProtocolError

__all__ = [
    "ERROR_CODES",
    "MAX_REPLY_BYTES",
    "MAX_REQUEST_BYTES",
    "OPS",
    "PROTOCOL_VERSION",
    "SHIM_OPS",
    "RequestError",
    "decode_reply",
    "decode_request",
    "encode",
    "error_reply",
    "optional_float",
    "optional_int",
    "require_bool",
    "require_str",
]


def decode_reply(line: bytes, source: str) -> dict[str, Any]:
    """A reply line as a dict with a bool `ok`; raises `HookProtocolError` naming `source`."""
    try:
        reply = json.loads(line.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError) as exc:
        raise HookProtocolError(f"hook at {source} sent a reply that is not JSON: {str(exc)[:200]}") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise HookProtocolError(f'hook at {source} sent a reply without a boolean "ok": {line[:200]!r}')
    return reply
