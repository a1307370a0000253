"""`medic resume`: lift a pause before it expires; `--fleet` lifts the namespace's."""

from __future__ import annotations

import argparse
import getpass
import json
import sys

from agent.cli.client import admin_token, agent_url, post_json
from agent.core.text import echo, printable

HELP = "resume remediation after `medic pause` (`--fleet`: after `medic pause --fleet`)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="lift the pause of every agent of this agent's namespace (`medic pause --fleet`)",
    )


def run(args: argparse.Namespace) -> int:
    body = {"by": getpass.getuser(), **({"scope": "fleet"} if args.fleet else {})}
    reply = post_json(
        agent_url(args.url, args.state_dir),
        "/api/v1/resume",
        body,
        admin_token(args.token_file, args.state_dir),
    )
    if args.json:
        print(json.dumps(reply, indent=2))
        return 0
    if args.fleet:
        where = printable(reply.get("coordinator"))
        echo(
            f"remediation resumed fleet-wide ({where})"
            if reply["resumed"]
            else f"the fleet was not paused ({where})"
        )
        return 0
    print("remediation resumed" if reply["resumed"] else "was not paused")
    if reply.get("persisted") is False:  # in force anyway; the agent keeps trying to store it
        print(
            f"warning: not persisted: {reply.get('warning') or 'the agent could not store it'}",
            file=sys.stderr,
        )
    return 0
