"""The hook protocol's rules, shared by the hook and medic's client (native_hooks.protocol).

One JSON object per line each way. Requests: `{"op": OP, ...}`; replies `{"ok": true, "op": ...}` or
`{"ok": false, "code": CODE, "error": "what and what to do"}`. A request line is at most
MAX_REQUEST_BYTES (the C shim has the same limit). tests/test_hook_contract.py runs one suite on
this hook and on the shim.
"""

from __future__ import annotations

import json
import math
from typing import Any

from medic_hook.errors import RequestError

PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 4096  # including the newline
MAX_REPLY_BYTES = 8 * 1024 * 1024
OPS = (
    "ping",
    "stats",
    "purge",
    "prof_dump",
    "prof_active",
    "histogram",
    "sites_start",
    "sites",
    "sites_stop",
)
SHIM_OPS = ("ping", "stats", "purge", "prof_dump", "prof_active")
# codes of {"ok": false} replies; medic's client maps unsupported/unavailable to "probe unavailable"
ERROR_CODES = (
    "bad_request",
    "too_large",
    "unknown_op",
    "unsupported",
    "unavailable",
    "too_expensive",
    "failed",
    "permission",
)


def decode_request(line: bytes) -> dict[str, Any]:
    """One request line (without its newline) as a dict with a string `op`; raises `RequestError`."""
    if len(line) >= MAX_REQUEST_BYTES:
        raise RequestError("too_large", f"request longer than {MAX_REQUEST_BYTES - 1} bytes")
    try:
        request = json.loads(line.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RequestError("bad_request", f"request is not one JSON object: {str(exc)[:200]}") from None
    if not isinstance(request, dict):
        raise RequestError("bad_request", f"request must be a JSON object, got {type(request).__name__}")
    op = request.get("op")
    if not isinstance(op, str):
        raise RequestError("bad_request", 'request needs "op": a string such as "ping" or "stats"')
    return request


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def encode(message: dict[str, Any]) -> bytes:
    """One line of compact ASCII JSON; floats that JSON cannot carry become null."""
    return (json.dumps(_finite(message), separators=(",", ":"), ensure_ascii=True) + "\n").encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(key): _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def error_reply(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "code": code, "error": message}


def require_str(request: dict[str, Any], key: str, *, absolute_path: bool = False) -> str:
    value = request.get(key)
    if not isinstance(value, str) or not value:
        raise RequestError("bad_request", f'{request["op"]} needs "{key}": a non-empty string')
    if "\x00" in value:
        raise RequestError("bad_request", f'"{key}" must not contain NUL characters')
    if absolute_path and not value.startswith("/"):
        raise RequestError("bad_request", f'"{key}" must be an absolute path, got {value!r}')
    return value


def optional_int(request: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = request.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError("bad_request", f'"{key}" must be an integer from {low} to {high}, got {value!r}')
    return value


def optional_float(request: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = request.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError("bad_request", f'"{key}" must be a number from {low} to {high}, got {value!r}')
    return float(value)


def require_bool(request: dict[str, Any], key: str) -> bool:
    value = request.get(key)
    if not isinstance(value, bool):
        raise RequestError("bad_request", f'{request["op"]} needs "{key}": true or false')
    return value
