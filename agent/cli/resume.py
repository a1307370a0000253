"""`medic resume`: lift a pause before it expires."""

from __future__ import annotations

import argparse
import getpass
import json
import sys

from agent.cli.client import admin_token, agent_url, post_json

HELP = "resume remediation after `medic pause`"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Only the shared options (`agent.cli.options`), which main adds."""


def run(args: argparse.Namespace) -> int:
    reply = post_json(
        agent_url(args.url, args.state_dir),
        "/api/v1/resume",
        {"by": getpass.getuser()},
        admin_token(args.token_file, args.state_dir),
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
