"""Alertmanager's webhook payload (version 4) in: parse, check, and map each alert to an instance.

Pure functions of bytes and label sets; `agent/api/alertmanager.py` adds HTTP, `external.py` the store.
Every problem raises `InboundError` with the HTTP status to answer and a message naming the field.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from agent.notify.model import parse_rfc3339

SUPPORTED_VERSION = "4"
_SEVERITIES = {
    "critical": "critical",
    "page": "critical",
    "emergency": "critical",
    "fatal": "critical",
    "error": "error",
    "high": "error",
    "major": "error",
    "warning": "warning",
    "warn": "warning",
    "medium": "warning",
    "minor": "warning",
    "info": "info",
    "low": "info",
    "none": "info",
}


class InboundError(ValueError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # newer Alertmanagers may add fields


class AmAlert(_Loose):
    status: Literal["firing", "resolved"]
    labels: dict[StrictStr, StrictStr]
    annotations: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    startsAt: StrictStr  # Alertmanager's field names
    endsAt: StrictStr = ""
    generatorURL: StrictStr = ""
    fingerprint: StrictStr = ""


class AmWebhook(_Loose):
    version: StrictStr
    status: Literal["firing", "resolved"]
    receiver: StrictStr = ""
    alerts: list[AmAlert]
    groupLabels: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    commonLabels: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    externalURL: StrictStr = ""
    groupKey: StrictStr = ""
    truncatedAlerts: StrictInt = 0


@dataclass(frozen=True, slots=True)
class InboundAlert:
    """One alert of a payload, checked: times as unix seconds, a fingerprint, a medic severity."""

    status: Literal["firing", "resolved"]
    fingerprint: str
    alertname: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float | None
    generator_url: str
    severity: str

    @property
    def summary(self) -> str:
        for name in ("summary", "description", "message"):
            if self.annotations.get(name):
                return self.annotations[name]
        return f"{self.alertname} is firing"


def parse_webhook(body: bytes, max_alerts: int) -> tuple[AmWebhook, list[InboundAlert]]:
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise InboundError(
            400, "the body is not UTF-8 text; send Alertmanager's JSON webhook payload"
        ) from None
    except json.JSONDecodeError as exc:
        raise InboundError(
            400,
            f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}; send Alertmanager's webhook payload",
        ) from None
    if not isinstance(data, dict):
        raise InboundError(
            400, f"expected a JSON object (Alertmanager's webhook payload), got {type(data).__name__}"
        )
    version = data.get("version")
    if version != SUPPORTED_VERSION:
        raise InboundError(
            400, f"unsupported payload version {version!r}: medic accepts Alertmanager's webhook version 4"
        )
    alerts = data.get("alerts")
    if isinstance(alerts, list) and len(alerts) > max_alerts:
        raise InboundError(
            413,
            f"{len(alerts)} alerts in one payload, at most {max_alerts}; set max_alerts in Alertmanager's webhook_config",
        )
    try:
        payload = AmWebhook.model_validate(data)
    except ValidationError as exc:
        raise InboundError(400, "; ".join(_describe(err) for err in exc.errors()[:10])) from None
    return payload, [_checked(alert, i) for i, alert in enumerate(payload.alerts)]


def _checked(alert: AmAlert, index: int) -> InboundAlert:
    starts = parse_rfc3339(alert.startsAt)
    if starts is None:
        raise InboundError(
            400, f"alerts[{index}].startsAt: expected an RFC 3339 time, got {alert.startsAt[:60]!r}"
        )
    ends = parse_rfc3339(alert.endsAt) if alert.endsAt else None
    if alert.endsAt and ends is None and not alert.endsAt.startswith("0001-01-01"):
        raise InboundError(
            400, f"alerts[{index}].endsAt: expected an RFC 3339 time, got {alert.endsAt[:60]!r}"
        )
    return InboundAlert(
        status=alert.status,
        fingerprint=alert.fingerprint or label_fingerprint(alert.labels),
        alertname=alert.labels.get("alertname", "unnamed"),
        labels=dict(alert.labels),
        annotations=dict(alert.annotations),
        starts_at=starts,
        ends_at=ends,
        generator_url=alert.generatorURL,
        severity=severity_of(alert.labels),
    )


def label_fingerprint(labels: dict[str, str]) -> str:
    """A stable id for a label set, when the sender gave no fingerprint."""
    text = "\x00".join(f"{k}\x01{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def severity_of(labels: dict[str, str]) -> str:
    """medic's severity for an alert's `severity` label (`page` → critical …); warning when absent or unknown."""
    return _SEVERITIES.get(labels.get("severity", "").strip().lower(), "warning")


def map_instance(labels: dict[str, str], known: set[str], instance_labels: list[str]) -> str | None:
    """The first of `instance_labels` whose value names a watched instance."""
    for name in instance_labels:
        value = labels.get(name)
        if value in known:
            return value
    return None


def ignored(labels: dict[str, str], ignore_labels: dict[str, str]) -> bool:
    return bool(ignore_labels) and all(labels.get(k) == v for k, v in ignore_labels.items())


def _describe(err: Any) -> str:
    where = ""
    for part in err.get("loc", ()):
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    message = err.get("msg", "invalid value")
    if err.get("type") == "missing":
        return f"{where}: missing"
    return f"{where or '<body>'}: {message}"
