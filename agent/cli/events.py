"""`medic events`: the agent's event log, newest first (or `--follow` to tail it); `--outbox` for the
notification outbox, `--requeue ID...` to give dead letters another round."""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime

from agent.cli.client import ApiReply, admin_token, agent_url, get_json, post_json
from agent.cli.options import free_text, when
from agent.core.text import echo, printable, render

HELP = "show the event log: discoveries, restarts, probe errors, agent starts and stops"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instance", help="only events of this instance")
    parser.add_argument("--kind", action="append", default=[], help="only events of this kind (repeatable)")
    parser.add_argument("--since", type=when, help="a duration ago (e.g. 2h) or a unix time")
    parser.add_argument("--limit", type=int, default=50, help="at most this many events (default 50)")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    parser.add_argument("--outbox", action="store_true", help="show the notification outbox instead")
    parser.add_argument(
        "--state", choices=["pending", "delivered", "dead"], help="with --outbox: only items in this state"
    )
    parser.add_argument(
        "--requeue",
        type=int,
        nargs="+",
        metavar="ID",
        help="queue these dead notifications again, once their target is fixed (admin token)",
    )
    parser.add_argument(
        "--reason",
        default="requeued with medic events",
        type=free_text,
        help="with --requeue: recorded in the event log",
    )


def _params(args: argparse.Namespace, **extra: object) -> dict[str, object]:
    params = {"instance": args.instance, "kind": args.kind, "since": args.since, "limit": args.limit, **extra}
    return {k: v for k, v in params.items() if v not in (None, [], "")}


def _rows(events: list[ApiReply]) -> list[list[object]]:
    return [
        [
            datetime.fromtimestamp(e["ts"]).strftime("%Y-%m-%d %H:%M:%S"),
            e["severity"],
            e.get("instance") or "-",
            e["kind"],
            str((e.get("data") or {}).get("action_id") or "-"),
            e["message"],
        ]
        for e in events
    ]


def run(args: argparse.Namespace) -> int:
    url = agent_url(args.url, args.state_dir)
    if args.requeue:
        body = {"ids": args.requeue, "reason": args.reason}
        reply = post_json(url, "/api/v1/outbox/requeue", body, admin_token(args.token_file, args.state_dir))
        if args.json:
            echo(json.dumps(reply, indent=2))
        else:
            echo(f"queued again: {', '.join(map(str, reply['requeued']))}")
            if reply["skipped"]:
                echo(f"not dead letters, left alone: {', '.join(map(str, reply['skipped']))}")
        return 0
    if args.outbox:
        from agent.cli.outbox import run_outbox

        return run_outbox(args, url)
    events = get_json(url, "/api/v1/events", _params(args))["events"]
    if args.json and not args.follow:
        echo(json.dumps(events, indent=2))
        return 0
    events.reverse()  # oldest first reads like a log
    if args.json:
        for event in events:
            echo(json.dumps(event), flush=True)
    elif events:
        echo(render(["TIME", "SEVERITY", "INSTANCE", "KIND", "ACTION", "MESSAGE"], _rows(events)), flush=True)
    if not args.follow:
        return 0
    last = max((e["id"] for e in events), default=0)
    while True:
        time.sleep(1.0)
        new = get_json(url, "/api/v1/events", _params(args, after_id=last, since=None))["events"]
        for event in new:
            last = max(last, event["id"])
            echo(json.dumps(event) if args.json else "  ".join(map(printable, _rows([event])[0])), flush=True)
