"""`medic purge NAME`: ask an instance's allocator to return free memory to the OS (the soft fix)."""

from __future__ import annotations

import argparse
import json

from agent.cli.client import admin_token, agent_url, post_json
from agent.cli.options import free_text
from agent.core.text import echo, printable
from agent.core.units import format_bytes

HELP = "purge an instance's allocator through its hook (jemalloc purge, tcmalloc release, glibc trim)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the instance")
    parser.add_argument(
        "--reason", default="requested with medic purge", type=free_text, help="recorded in the event log"
    )
    parser.add_argument("--gc", action="store_true", help="Python hook only: run the garbage collector first")


def run(args: argparse.Namespace) -> int:
    body = {"reason": args.reason, "gc": args.gc}
    reply = post_json(
        agent_url(args.url, args.state_dir),
        f"/api/v1/instances/{args.name}/purge",
        body,
        admin_token(args.token_file, args.state_dir),
    )
    if args.json:
        echo(json.dumps(reply, indent=2))
        return 0
    result = reply["purge"]
    echo(
        f"{args.name}: {printable(result['allocator'])} {printable(result['action'])} "
        f"returned {format_bytes(result['returned_bytes'])} "
        f"(RSS {format_bytes(result['rss_before'])} → {format_bytes(result['rss_after'])}, "
        f"{result['duration_s'] * 1000:.0f} ms)"
    )
    return 0
