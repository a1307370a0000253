"""Alertmanager: `POST /api/v2/alerts` with medic's labels and annotations.

Labels (the alert's identity), the same names the shipped Prometheus rules give their alerts
(docs/alerts.md, "One label model"): `alertname`, `name` (the watched instance), `agent` (the agent
that watches it: replicas of one workload, watched by one agent each, stay separate alerts),
`fleet`, `severity`, `kind`, the instance's configured labels, and `source="medic"` (the receiver
ignores alerts carrying it, so medic never turns its own alerts into findings). `instance` is not
set: in Prometheus it is the scrape target, the agent's address, which medic does not know as
Prometheus sees it. Annotations: `summary`, `description` (what to look at first), `runbook_url`,
`dashboard` (a page on-call can open: `notify.dashboard_url` or `agent.external_url`, never a
loopback address; also the `generatorURL`), `finding_id`, `action_id`. The evidence stays in medic
(`medic events`, the dashboard, the webhook's JSON): an annotation is for a person to read.

Alertmanager resolves an alert by itself at its `endsAt`. A firing alert is posted with
`endsAt = now + 4 x repost_interval` and re-posted every `repost_interval` while it lasts (as
Prometheus does), so it ends on its own if medic stops; a resolved alert carries its end time.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, ClassVar

from agent.notify.config import MIN_SECRET_CHARS, AlertmanagerSinkSpec
from agent.notify.model import Notification, rfc3339
from agent.notify.sinks.base import HttpSink, Request
from probes.linux.secrets import read_token

if TYPE_CHECKING:
    import httpx

_LABEL_INVALID = re.compile(r"[^A-Za-z0-9_]")
RESERVED = ("alertname", "name", "agent", "instance", "fleet", "severity", "kind", "source")
MAX_SUMMARY = 500  # characters: a line a person reads in a notification, not a report
SOURCE = "medic"


def label_name(name: str) -> str:
    """A config label name made valid for Prometheus (`app.kubernetes.io/name` → `app_kubernetes_io_name`)."""
    fixed = _LABEL_INVALID.sub("_", name)
    return f"_{fixed}" if fixed[:1].isdigit() else fixed


def alert_labels(note: Notification) -> dict[str, str]:
    labels = {label_name(k): str(v) for k, v in note.labels.items() if label_name(k) not in RESERVED}
    labels["alertname"] = note.alertname or "MedicEvent"
    labels["severity"] = note.severity
    labels["source"] = SOURCE
    for name, value in (
        ("name", note.instance),
        ("agent", note.agent),
        ("fleet", note.fleet),
        ("kind", note.kind),
    ):
        if value:
            labels[name] = value
    return labels


def alert_annotations(note: Notification) -> dict[str, str]:
    summary = note.summary if len(note.summary) <= MAX_SUMMARY else note.summary[: MAX_SUMMARY - 1] + "…"
    annotations = {"summary": summary, "description": note.description or note.message}
    for name, value in (
        ("runbook_url", note.runbook),
        ("dashboard", note.link),
        ("finding_id", note.finding_id),
        ("action_id", note.action_id),
    ):
        if value:
            annotations[name] = str(value)
    return annotations


def postable_alert(note: Notification, now: float, repost_interval: float) -> dict[str, Any]:
    ends = note.ends_at if note.ends_at is not None else now + 4 * repost_interval
    alert: dict[str, Any] = {
        "labels": alert_labels(note),
        "annotations": alert_annotations(note),
        "startsAt": rfc3339(note.starts_at or note.ts),
        "endsAt": rfc3339(ends),
    }
    if note.link:
        alert["generatorURL"] = note.link
    return alert


class AlertmanagerSink(HttpSink):
    type: ClassVar[str] = "alertmanager"
    takes = "alerts"
    spec: AlertmanagerSinkSpec

    def __init__(
        self,
        name: str,
        spec: AlertmanagerSinkSpec,
        where: str,
        *,
        url: str | None = None,
        group: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(name, spec, transport=transport)
        self.url = url or spec.replicas[0]
        self.group = group or name  # the configured sink; its replicas share it (and its silences)
        if spec.bearer_token_file is not None:
            token = read_token(spec.bearer_token_file, f"{where}.bearer_token_file", MIN_SECRET_CHARS)
            self.client.headers["Authorization"] = f"Bearer {token}"

    def render(self, note: Notification, delivery_id: int, now: float) -> Request:
        body = json.dumps([postable_alert(note, now, self.spec.repost_interval)]).encode()
        return Request(f"{self.url}/api/v2/alerts", body, {})
