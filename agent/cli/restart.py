"""`medic restart NAME --reason …`: ask for a restart through the same budget and coordinator as any other
(`--force` skips the budget and blockers, never the coordinator; it is logged with the reason)."""

from __future__ import annotations

import argparse
import getpass
import json
from datetime import datetime
from typing import TypeGuard

from agent.cli.client import ApiReply, admin_token, agent_url, post_json
from agent.cli.options import free_text
from agent.core.text import echo, printable

HELP = "request a restart of an instance (goes through the budget; --force with a reason to skip it)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the instance")
    parser.add_argument(
        "--reason", required=True, type=free_text, help="why: recorded in the ledger and the event log"
    )
    parser.add_argument("--force", action="store_true", help="skip the budget and blockers (logged)")


def run(args: argparse.Namespace) -> int:
    body = {"reason": args.reason, "force": args.force, "by": getpass.getuser()}
    reply = post_json(
        agent_url(args.url, args.state_dir),
        f"/api/v1/instances/{args.name}/restart",
        body,
        admin_token(args.token_file, args.state_dir),
    )
    if args.json:
        echo(json.dumps(reply, indent=2))
    else:
        echo(answer(args.name, reply))
    return 0


def answer(name: str, reply: ApiReply) -> str:
    """What became of the request, in one line: started, would restart (dry-run), or held and why."""
    decision = reply.get("decision") or reply.get("accepted") or {}
    action = f" (action {reply['action_id']})" if isinstance(reply.get("action_id"), int) else ""
    mode = printable(reply.get("mode"))
    reason = printable(decision.get("reason") or "")
    status = reply.get("status")
    if status == "held":
        retry = decision.get("retry_at")
        when = f"; tried again at {datetime.fromtimestamp(retry):%H:%M:%S}" if _is_time(retry) else ""
        return (
            f"{printable(name)}: restart requested{action} but HELD ({printable(decision.get('stage'))}/"
            f"{printable(decision.get('code'))}): {reason}{when}; mode {mode}; "
            f"`medic plan` and `medic actions {printable(name)}` keep saying why"
        )
    if status in ("started", "would-restart"):
        return f"{printable(name)}: {reason}; mode {mode}"
    return f"{printable(name)}: restart requested{action} ({reason}); mode {mode}; see `medic plan`"


def _is_time(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 4102444800
