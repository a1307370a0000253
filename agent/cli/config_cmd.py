"""`medic config check FILE`: validate a config file and print the effective configuration."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from agent.core.text import echo

if TYPE_CHECKING:
    from agent.config.model import Config

HELP = "validate a config file (`medic config check FILE`) and print the effective configuration"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="validate FILE; exit 2 with one line per problem if it is invalid")
    check.add_argument("file")
    check.add_argument("--json", action="store_true", help="print the effective config as JSON")
    check.add_argument("--quiet", "-q", action="store_true", help="print nothing when the file is valid")


def _warnings(config: Config) -> list[str]:
    """Valid, but probably not what was meant."""
    from agent.config.timescale import time_axis
    from agent.watch.supervisor import relaunch_warnings

    axis = time_axis(config)
    loop = axis.remediation.ladder.crash_loop  # as judged, on agent.time_scale
    return relaunch_warnings(
        config.instances, loop.window, loop.reset_after, loop.max_restarts, axis.scale.compressed
    )


def _time_axis(config: Config) -> list[str]:
    """With agent.time_scale: every duration it changed, as comment lines of the printed config."""
    from agent.config.timescale import scaled
    from agent.core.units import format_fine_duration as shown

    factor = config.agent.time_scale
    if factor == 1:
        return []
    lines = [f"# agent.time_scale {factor:g}: durations below are production's; medic judges and waits by"]
    for item in scaled(config):
        held = " (held at its floor)" if item.held(factor) else ""
        lines.append(f"#   {item.key}: {shown(item.written)} -> {shown(item.used)}{held}")
    return lines


def run(args: argparse.Namespace) -> int:
    from agent.config.loader import dump_config, load_config
    from agent.config.timescale import notes

    config = load_config(args.file)
    for warning in _warnings(config):
        echo(f"{args.file}: warning: {warning}", file=sys.stderr)
    if args.quiet:
        return 0
    for note in notes(config):
        echo(f"{args.file}: note: {note}", file=sys.stderr)
    if args.json:
        echo(json.dumps(config.model_dump(mode="json", by_alias=True), indent=2))
    else:
        echo(f"# {args.file}: valid; effective configuration (durations in seconds, sizes in bytes)")
        for line in _time_axis(config):
            echo(line)
        echo(dump_config(config), end="")
    return 0
