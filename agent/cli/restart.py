"""`medic restart NAME --reason …`: ask for a restart through the same budget and coordinator as any other
(`--force` skips the budget and blockers, never the coordinator; it is logged with the reason)."""

from __future__ import annotations

import argparse
import getpass
import json

from agent.cli.client import admin_token, agent_url, post_json
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
        echo(
            f"{args.name}: restart requested ({printable(reply['accepted']['reason'])}); "
            f"mode {printable(reply.get('mode'))}; see `medic plan`"
        )
    return 0
