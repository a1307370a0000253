"""Slack-compatible incoming webhook: `text` (every client shows it) plus Block Kit `blocks`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from agent.notify.config import SlackSinkSpec
from agent.notify.model import Notification
from agent.notify.sinks.base import HttpSink, Request

if TYPE_CHECKING:
    import httpx

_ICONS = {"firing": ":rotating_light:", "resolved": ":white_check_mark:", "info": ":information_source:"}
MAX_TEXT = 2900  # Slack truncates section text at 3000 characters


def escape(text: str) -> str:
    """Slack's three control characters; everything else is shown as written."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def headline(note: Notification) -> str:
    what = note.alertname or note.event_kind
    status = f"[{note.status.upper()}] " if note.status != "info" else ""
    where = f" · {note.instance}" if note.instance else ""
    where += f" on {note.agent}" if note.instance and note.agent else ""
    fleet = f" (fleet {note.fleet})" if note.fleet else ""
    return f"{_ICONS[note.status]} *{status}{escape(what)}*{escape(where + fleet)} · {note.severity}"


def slack_message(note: Notification) -> dict[str, Any]:
    body = escape(note.summary if note.status != "info" else note.message)[:MAX_TEXT]
    text = f"{headline(note)}\n{body}"
    context = [f"event `{note.event_kind}`"]
    if note.action_id:
        context.append(f"action {escape(str(note.action_id))}")
    if note.link:
        context.append(f"<{note.link}|dashboard>")
    if note.runbook:
        context.append(f"<{note.runbook}|runbook>")
    return {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(context)}]},
        ],
    }


class SlackSink(HttpSink):
    type: ClassVar[str] = "slack"

    spec: SlackSinkSpec

    def __init__(
        self, name: str, spec: SlackSinkSpec, where: str, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        super().__init__(name, spec, transport=transport)
        self.url = spec.resolved_url(where)

    def render(self, note: Notification, delivery_id: int, now: float) -> Request:
        return Request(self.url, json.dumps(slack_message(note)).encode(), {})
