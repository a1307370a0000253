"""`medic doctor NAME` (or `--pid PID`): which allocator a process uses, whether its hook answers, and what
to add (LD_PRELOAD, MALLOC_CONF, an environment variable) to let medic see more."""

from __future__ import annotations

import argparse
import json

from agent.cli.client import agent_url, get_json
from agent.core.errors import UsageError
from agent.core.text import echo

HELP = "diagnose an instance or pid: its allocator, its hook, and the settings that give medic more to see"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", nargs="?", help="an instance of the running agent (its pid and hook come from it)"
    )
    parser.add_argument("--pid", type=int, help="diagnose this process instead (no agent needed)")
    parser.add_argument(
        "--socket", help="its hook socket (default: the instance's hook.socket, else by convention)"
    )
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the hook (default 2)")
    parser.add_argument("--url", help="agent API address (env MEDIC_URL)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    from native_hooks.doctor import diagnose, render

    pid, socket = args.pid, args.socket
    if args.name and pid is None:
        instance = get_json(agent_url(args.url, args.state_dir), f"/api/v1/instances/{args.name}")["instance"]
        if instance.get("pid") is None:
            raise UsageError(f"{args.name} has no running process ({instance.get('status_reason')})")
        pid = instance["pid"]
        configured = (instance.get("settings") or {}).get("hook", {}).get("socket")
        if socket is None and configured:
            socket = configured.replace("%p", str(pid))
    if pid is None:
        raise UsageError("name an instance of the running agent, or give --pid PID")
    report = diagnose(pid, socket=socket, timeout=args.timeout)
    echo(json.dumps(report.to_dict(), indent=2) if args.json else render(report))
    return 0
