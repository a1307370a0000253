"""`medic resume`: lift a pause before it expires."""

from __future__ import annotations

import argparse
import getpass
import json
import sys

from agent.cli.client import add_token_argument, add_url_argument, admin_token, agent_url, post_json

HELP = "resume remediation after `medic pause`"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_url_argument(parser)
    add_token_argument(parser)


def run(args: argparse.Namespace) -> int:
    reply = post_json(
        agent_url(args.url), "/api/v1/resume", {"by": getpass.getuser()}, admin_token(args.token_file)
    )
    if args.json:
        print(json.dumps(reply, indent=2))
        return 0
    print("remediation resumed" if reply["resumed"] else "was not paused")
    if reply.get("persisted") is False:  # in force anyway; the agent keeps trying to store it
        print(
            f"warning: not persisted: {reply.get('warning') or 'the agent could not store it'}",
            file=sys.stderr,
        )
    return 0
