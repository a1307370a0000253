"""`medic config check FILE`: validate a config file and print the effective configuration."""

from __future__ import annotations

import argparse
import json
import sys

from agent.core.text import echo

HELP = "validate a config file (`medic config check FILE`) and print the effective configuration"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="validate FILE; exit 2 with one line per problem if it is invalid")
    check.add_argument("file")
    check.add_argument("--json", action="store_true", help="print the effective config as JSON")
    check.add_argument("--quiet", "-q", action="store_true", help="print nothing when the file is valid")


def _warnings(config) -> list[str]:
    """Valid, but probably not what was meant."""
    from agent.watch.supervisor import relaunch_warnings

    loop = config.remediation.ladder.crash_loop
    return relaunch_warnings(config.instances, loop.window, loop.reset_after, loop.max_restarts)


def run(args: argparse.Namespace) -> int:
    from agent.config.loader import dump_config, load_config

    config = load_config(args.file)
    for warning in _warnings(config):
        echo(f"{args.file}: warning: {warning}", file=sys.stderr)
    if args.quiet:
        return 0
    if args.json:
        echo(json.dumps(config.model_dump(mode="json", by_alias=True), indent=2))
    else:
        echo(f"# {args.file}: valid; effective configuration (durations in seconds, sizes in bytes)")
        echo(dump_config(config), end="")
    return 0
