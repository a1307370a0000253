"""`medic clear NAME`: a person has looked at an escalated instance: remediation may act on it again,
the supervisor relaunches it again (a crash-looping `command:` instance is held until then), and its
crash-loop count and restart history start afresh."""

from __future__ import annotations

import argparse
import getpass
import json

from agent.cli.client import admin_token, agent_url, post_json
from agent.core.text import echo, printable

HELP = "clear an instance's escalation: remediation and relaunches may act on it again"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the escalated instance (`medic plan` lists escalations)")


def run(args: argparse.Namespace) -> int:
    reply = post_json(
        agent_url(args.url, args.state_dir),
        f"/api/v1/instances/{args.name}/clear",
        {"note": getpass.getuser()},
        admin_token(args.token_file, args.state_dir),
    )
    if args.json:
        echo(json.dumps(reply, indent=2))
    else:
        echo(f"{printable(args.name)}: escalation cleared; remediation and relaunches may act on it again")
    return 0
