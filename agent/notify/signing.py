"""HMAC-SHA256 signatures over `timestamp.body`, for webhooks out and the Alertmanager receiver in.

    X-Medic-Timestamp: 1764416249
    X-Medic-Signature: sha256=<hex of HMAC-SHA256(secret, b"1764416249." + body)>

Signing the timestamp with the body lets a receiver refuse replays older than a few minutes;
comparisons are constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import math

from agent.core.figures import decimal

TIMESTAMP_HEADER = "X-Medic-Timestamp"
SIGNATURE_HEADER = "X-Medic-Signature"
_PREFIX = "sha256="


class SignatureError(ValueError):
    """A signature is missing, malformed, stale or wrong; the message says which."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return _PREFIX + digest


def signature_headers(secret: str, body: bytes, now: float) -> dict[str, str]:
    timestamp = int(now)
    return {TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: sign(secret, timestamp, body)}


def verify(
    secret: str, timestamp: str | None, signature: str | None, body: bytes, now: float, tolerance: float
) -> None:
    """Raise `SignatureError` unless `signature` signs `timestamp.body` and the timestamp is recent."""
    if not timestamp or not signature:
        raise SignatureError(f"send both {TIMESTAMP_HEADER} and {SIGNATURE_HEADER} headers")
    when = decimal(timestamp.strip(), 10**15)  # no clock is wider; no float overflow
    if when is None:
        raise SignatureError(f"{TIMESTAMP_HEADER} must be unix seconds, got {timestamp[:40]!r}")
    if not math.isfinite(now) or abs(now - when) > tolerance:
        raise SignatureError(
            f"{TIMESTAMP_HEADER} is {abs(now - when):.0f}s away from the agent's clock (allowed: {tolerance:.0f}s); "
            "check both clocks, or this is a replay"
        )
    if not signature.startswith(_PREFIX):
        raise SignatureError(f"{SIGNATURE_HEADER} must look like sha256=<hex>")
    if not hmac.compare_digest(signature.strip().encode(), sign(secret, when, body).encode()):
        raise SignatureError("the signature does not match the body: wrong secret, or the body was altered")
