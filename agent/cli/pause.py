"""`medic pause --for 2h --reason …`: the kill switch for all remediation, on this agent or, with
`--fleet`, on every agent of its namespace (through the coordinator); `medic resume` lifts it."""

from __future__ import annotations

import argparse
import getpass
import json
import sys

from agent.cli.client import admin_token, agent_url, post_json
from agent.cli.options import duration, free_text
from agent.core.text import echo, printable

HELP = "pause all remediation (purges and restarts) for a while, with a reason; it expires by itself"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--for", type=duration, dest="duration", default="1h", help="how long, e.g. 30m, 2h (default 1h)"
    )
    parser.add_argument(
        "--reason", required=True, type=free_text, help="why: shown in `medic plan` and the event log"
    )
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="pause every agent of this agent's namespace, through the shared coordinator "
        "(lifted with `medic resume --fleet`)",
    )


def run(args: argparse.Namespace) -> int:
    body = {"reason": args.reason, "duration": args.duration, "by": getpass.getuser()}
    if args.fleet:
        body["scope"] = "fleet"
    reply = post_json(
        agent_url(args.url, args.state_dir),
        "/api/v1/pause",
        body,
        admin_token(args.token_file, args.state_dir),
    )
    if args.json:
        print(json.dumps(reply, indent=2))
        return 0
    if args.fleet:
        echo(
            f"remediation paused fleet-wide for {args.duration} ({printable(reply.get('coordinator'))}): "
            f"{printable(args.reason)}"
        )
        return 0
    print(f"remediation paused for {args.duration}: {args.reason}")
    if reply.get("persisted") is False:  # in force anyway; the agent keeps trying to store it
        print(
            f"warning: not persisted: {reply.get('warning') or 'the agent could not store it'}",
            file=sys.stderr,
        )
    return 0
