"""`medic events --outbox`: what waits to be delivered, what was, and what was given up on (and why)."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from agent.cli.client import ApiReply, get_json
from agent.core.text import echo, printable, render
from agent.core.units import format_duration


def _time(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _what(item: ApiReply) -> str:
    payload = item.get("payload") or {}
    status = payload.get("status")
    name = payload.get("alertname") or item["kind"]
    return f"{name} ({status})" if status and status != "info" else name


def run_outbox(args: argparse.Namespace, url: str) -> int:
    params = {"state": getattr(args, "state", None), "instance": args.instance, "limit": args.limit}
    answer = get_json(url, "/api/v1/outbox", {k: v for k, v in params.items() if v is not None})
    if args.json:
        echo(json.dumps(answer, indent=2))
        return 0
    now = answer["now"]
    sinks = [
        [name, s["pending"], s["dead"], format_duration(s["oldest_pending_age"])]
        for name, s in sorted(answer["sinks"].items())
    ]
    if sinks:
        echo(render(["SINK", "PENDING", "DEAD", "OLDEST"], sinks, numeric={1, 2}))
    else:
        echo("no notification sinks configured (notify.sinks in the config)")
    items = list(reversed(answer["items"]))  # oldest first reads like a log
    if items:
        rows = []
        for item in items:
            due = item.get("next_attempt_at")
            when = (
                f"retry in {format_duration(max(0.0, due - now))}"
                if item["state"] == "pending" and due
                else ""
            )
            rows.append(
                [
                    item["id"],
                    _time(item["created_at"]),
                    item["sink"],
                    item["state"],
                    item["attempts"],
                    item.get("instance") or "-",
                    _what(item),
                    when or (item.get("last_error") or "")[:80],
                ]
            )
        echo()
        echo(
            render(
                ["ID", "QUEUED", "SINK", "STATE", "TRIES", "INSTANCE", "WHAT", "NEXT / LAST ERROR"],
                rows,
                {0, 4},
            )
        )
    for silence in answer.get("silences", []):
        what = f"{printable(silence['alertname'])} of {printable(silence['instance'])}"
        echo(
            f"\nsilenced in {printable(silence['sink'])}: {what} "
            f"(action {silence['action_id']}) until {_time(silence['until'])}"
        )
    return 0
