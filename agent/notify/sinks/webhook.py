"""Generic webhook: one JSON document per event (schema version 1, docs/alerts.md), signed.

Headers: `X-Medic-Timestamp`, `X-Medic-Signature: sha256=…` (HMAC-SHA256 over `timestamp.body`,
see `signing.py`), `X-Medic-Event` (the event kind) and `X-Medic-Delivery` (the outbox id: the
same for every attempt of one delivery, so a receiver can drop duplicates).
"""

from __future__ import annotations

import json
import socket
from typing import TYPE_CHECKING, Any, ClassVar

from agent import __version__
from agent.core.errors import ConfigError
from agent.notify.config import WebhookSinkSpec
from agent.notify.model import Notification, rfc3339
from agent.notify.signing import signature_headers
from agent.notify.sinks.base import HttpSink, Request

if TYPE_CHECKING:
    import httpx

SCHEMA_VERSION = "1"


def webhook_document(note: Notification, delivery_id: int, now: float) -> dict[str, Any]:
    return {
        "version": SCHEMA_VERSION,
        "delivery_id": delivery_id,
        "sent_at": rfc3339(now),
        "status": note.status,
        "severity": note.severity,
        "summary": note.summary,
        "message": note.message,
        "instance": note.instance,
        "fleet": note.fleet,
        "kind": note.kind,
        "labels": note.labels,
        "event": {
            "id": note.event_id,
            "kind": note.event_kind,
            "source_kind": note.data.get("kind", note.event_kind),
            "ts": rfc3339(note.ts),
        },
        "alert": None
        if note.alertname is None
        else {
            "name": note.alertname,
            "key": note.key,
            "starts_at": rfc3339(note.starts_at or note.ts),
            "ends_at": rfc3339(note.ends_at) if note.ends_at is not None else None,
        },
        "finding_id": note.finding_id,
        "action_id": note.action_id,
        "evidence": note.evidence,
        "link": note.link,
        "runbook_url": note.runbook,
        "agent": {"name": note.agent, "host": socket.gethostname(), "version": __version__},
    }


class WebhookSink(HttpSink):
    type: ClassVar[str] = "webhook"

    spec: WebhookSinkSpec

    def __init__(
        self, name: str, spec: WebhookSinkSpec, where: str, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        super().__init__(name, spec, transport=transport)
        secret = spec.secret(where)
        if secret is None:  # WebhookSinkSpec asks for exactly one of secret_env, secret_file
            raise ConfigError(f"{where}: give secret_env or secret_file: webhooks are always signed")
        self.secret = secret
        self.client.headers.update(spec.headers)

    def render(self, note: Notification, delivery_id: int, now: float) -> Request:
        body = json.dumps(webhook_document(note, delivery_id, now), default=str).encode()
        headers = {
            **signature_headers(self.secret, body, now),
            "X-Medic-Event": note.event_kind,
            "X-Medic-Delivery": str(delivery_id),
        }
        return Request(self.spec.url, body, headers)
