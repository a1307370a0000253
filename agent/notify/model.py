"""`Notification`: what one event means to a human, independent of the sink that carries it.

The router builds them, the outbox stores them as JSON, and each sink renders them in its own
format at delivery time (so an Alertmanager re-post always carries a fresh `endsAt`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

Status = Literal["firing", "resolved", "info"]


@dataclass(frozen=True, slots=True)
class Notification:
    key: str  # the alert's identity: the same key is the same Alertmanager alert
    status: Status
    event_kind: str  # canonical (see routes.py); the original kind is in `data["kind"]`
    event_id: int | None
    ts: float
    severity: str
    summary: str  # one line for a person
    message: str  # the event's message
    alertname: str | None = None
    instance: str | None = None  # the watched instance's name (label `name` in Alertmanager)
    agent: str | None = None  # the agent that watches it (`agent.name`, the pod's name in Kubernetes)
    fleet: str | None = None
    kind: str | None = None  # the finding's kind, when there is one
    evidence: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # the instance's configured labels
    finding_id: str | None = None
    action_id: str | None = None
    starts_at: float = 0.0
    ends_at: float | None = None  # resolved: when it ended; once: when it lapses; firing: None
    link: str | None = None  # a page on-call can open: the dashboard, never a loopback address
    runbook: str | None = None  # what the alert means and what to do (docs/runbooks.md)
    description: str | None = None  # a sentence or two beside the summary: what to look at first
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Notification:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def rfc3339(ts: float) -> str:
    """`2026-11-29T11:37:29.874Z`: the time format Alertmanager and most webhook consumers expect."""
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_rfc3339(text: str) -> float | None:
    """Unix seconds from an RFC 3339 time (nanoseconds allowed); None for Alertmanager's zero time."""
    if not isinstance(text, str) or not text or text.startswith("0001-01-01"):
        return None
    value = text.strip().replace("z", "Z").replace("Z", "+00:00")
    head, dot, rest = value.partition(".")
    if dot:  # Python parses 6 fractional digits; Alertmanager sends up to 9
        digits = len(rest) - len(rest.lstrip("0123456789"))
        rest = rest[:digits][:6].ljust(6, "0") + rest[digits:]  # 3.10 wants 3 or 6 digits
        value = f"{head}.{rest}"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()
