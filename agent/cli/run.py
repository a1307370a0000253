"""`medic run`: start the agent.

medic run --config medic.yaml            watch the instances of a config file
medic run -- python serve.py --port 80   launch a command as instance `main` and watch it;
                                         medic exits with its exit status
medic run --pid 1234 --match 'NAME=model_server'   watch processes named on the command line
medic run --port 9500 --json             listen on 127.0.0.1:9500; print {"url", "state_dir", "pid", "version"}
                                         as one JSON line once listening
medic run                                 no config: the built-in demo (sample workloads: one
                                         leaking, one slow among three fast peers), on a
                                         compressed time axis, in enforce mode: a slow and a
                                         leak finding within 2 minutes, the leak restarted
                                         before its limit
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from agent.cli.options import duration
from agent.core.text import echo, printable

if TYPE_CHECKING:
    from pathlib import Path

    from agent.config.model import Config
    from agent.runtime import AgentInfo

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]

HELP = "run the agent (on a config, a command after --, pids/regexes, or the built-in demo)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__
    parser.add_argument("--config", "-c", help="YAML config file (see examples/medic.yaml)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--listen", help="HOST:PORT of the API and /metrics (default 127.0.0.1:9464)")
    where.add_argument("--port", type=int, help="shorthand for --listen 127.0.0.1:PORT (0: any free port)")
    parser.add_argument("--state-dir", help="where the SQLite store lives (default ./medic-state)")
    parser.add_argument("--interval", type=duration, help="probe interval, e.g. 1s (default 5s)")
    parser.add_argument("--pid", type=int, action="append", default=[], help="watch this pid (repeatable)")
    parser.add_argument(
        "--match",
        action="append",
        default=[],
        metavar="[NAME=]REGEX",
        help="watch the newest process whose command line matches REGEX (repeatable)",
    )
    parser.add_argument(
        "--memory-limit", help="limit for instances given on the command line (default: auto)"
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- CMD ARGS: launch and watch this command"
    )


def build_config(args: argparse.Namespace) -> tuple[Config, str | None, bool]:
    """The validated config from file + flags; returns (config, main instance name, is_demo)."""
    from agent.config.loader import load_config, validate_config
    from agent.core.errors import UsageError
    from agent.watch.discovery import by_pid

    data: dict[str, Any] = {}  # the config's JSON form, as pydantic dumps it: validated below
    if args.config:
        data = load_config(args.config).model_dump(mode="json", exclude_defaults=True, by_alias=True)
    agent = data.setdefault("agent", {})
    if args.port is not None:
        args.listen = f"127.0.0.1:{args.port}"
    for flag, key in (("listen", "listen"), ("state_dir", "state_dir"), ("interval", "interval")):
        if getattr(args, flag):
            agent[key] = getattr(args, flag)
    instances = data.setdefault("instances", [])
    extra: dict[str, str] = {"memory_limit": args.memory_limit} if args.memory_limit else {}
    for pid in args.pid:
        if by_pid(pid) is None:  # a pid names one process: none now means none ever (pids are reused)
            raise UsageError(
                f"--pid {pid}: no process {pid} is running; give the pid of a running process "
                "(`pgrep -f NAME`), or --match REGEX to wait for one"
            )
        instances.append({"name": f"pid-{pid}", "match": {"pid": pid}, **extra})
    for index, item in enumerate(args.match):
        name, sep, regex = item.partition("=")
        if not sep:
            name, regex = f"match-{index}", item
        instances.append({"name": name, "match": {"cmdline": regex}, **extra})
    command = [c for c in args.command if c != "--"] if args.command else []
    if args.command and args.command[0] == "--":
        command = args.command[1:]
    main = None
    if command:
        main = "main"
        instances.append(
            {
                "name": main,
                "match": {"command": command},
                "restart_on_exit": False,
                "stop_timeout": 10,
                **extra,
            }
        )
    demo = not args.config and not instances
    if demo:
        instances.extend(demo_instances())
        data["detect"] = dict(DEMO_DETECT)
        data["remediation"] = dict(DEMO_REMEDIATION)
        for key, value in DEMO_AGENT.items():
            agent.setdefault(key, value)  # --interval and the other flags win
    return validate_config(data, source=args.config or "command line"), main, demo


# The built-in demo shows its findings within two minutes and restarts the leak before its limit: the
# leaking workload is judged against a small limit, one of four workloads answering HTTP is slow, and
# every duration medic judges or waits by runs on a compressed time axis (a day in 4 minutes). medic
# acts only on the workloads it launched itself, so the demo runs in enforce mode.
DEMO_LIMIT = "160Mi"
DEMO_LEAK_RATE = "2Mi"
# the leak stops growing here, past the limit, so that a forgotten demo cannot take the host down; in
# dry-run it ends there, above a limit only its config sets (the kernel does not enforce it), its
# oom-risk finding open and saying so, and the would-be restart in the plan and the actions
DEMO_LEAK_CAP = "192Mi"
DEMO_SLOW_DELAY = "150ms"
DEMO_TIME_SCALE = 360
DEMO_AGENT = {
    "interval": "1s",
    "time_scale": DEMO_TIME_SCALE,
    "slow_interval": "2s",  # the type histograms and allocation sites that name the suspects
    "flush_interval": "1s",
    "discovery_interval": "2s",
}
# production's shape for memory (a 3 h trend window, 6 h for slow leaks, a daily cycle learnt over
# 36 min of history): judged over 30 s, 60 s and 6 s; a fast server starved of CPU for a moment by a
# busy host is not the slow one: 20 ms above its peers at least (production: 5 ms)
DEMO_DETECT = {
    "interval": "1s",
    "memory": {"window": "3h", "long_window": "6h", "season": "36m"},
    "slow": {"peer_floor": "20ms"},
}
# the workloads run medic's in-process hook: a type histogram every 2 s, and allocation sites every 2 s
# once the leak's finding opens, so that the finding names what grows (`bytes`, and the line)
DEMO_HISTOGRAMS = {"python": {"interval": "2s", "sites": {"interval": "2s", "frames": 2}}}
DEMO_REMEDIATION = {"mode": "enforce", "interval": "1s"}  # production's budget, plan and ladder, compressed


def demo_instances(rate: str = DEMO_LEAK_RATE, cap: str = DEMO_LEAK_CAP) -> list[dict[str, object]]:
    """demo-leaky and demo-stable (memory), demo-fast and demo-slow: four peers whose latency a canary
    times, one of them 150 ms slow; `rate` and `cap` of the leak (a test runs the demo faster)."""
    from agent.demo.fleet import free_ports

    py = sys.executable
    serving = {"labels": {"fleet": "demo"}, "memory_limit": DEMO_LIMIT}
    # the memory workloads run medic's in-process hook, so that the leak's finding names what grows
    hooked = {"histograms": DEMO_HISTOGRAMS}
    workloads = {
        "demo-leaky": (["leak", "--rate", rate, "--cap", cap, "--hook"], hooked),
        "demo-stable": (["stable", "--size", "48Mi", "--hook"], hooked),
        "demo-fast": (["stable", "--size", "16Mi"], {}),
        "demo-slow": (["stable", "--size", "16Mi", "--delay", DEMO_SLOW_DELAY], {}),
    }
    instances: list[dict[str, object]] = []
    for (name, (args, extra)), port in zip(workloads.items(), free_ports(len(workloads)), strict=True):
        canary = {"url": f"http://127.0.0.1:{port}/", "interval": "1s", "timeout": "2s"}
        instances.append(
            {
                "name": name,
                "match": {"command": [py, "-m", "agent.demo.workload", *args, "--port", str(port)]},
                "latency": {"canary": canary},
                **serving,
                **extra,
            }
        )
    return instances


class PrintableFormatter(logging.Formatter):
    """Log lines with control characters escaped: messages carry process names, command lines and
    reasons that others wrote, and a newline or an escape sequence in them must not forge or hide a line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: ExcInfo) -> str:
        return printable(super().formatException(ei), newlines=True)

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info), newlines=True)


# libraries that log each job run or each request at INFO: at WARNING, INFO is medic's own
QUIET_LOGGERS = ("apscheduler", "httpx", "httpcore")


def configure_logging(level: str) -> None:
    """The agent's log: printable lines on stderr at `level`, without the libraries' per-request chatter."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter("%(asctime)s medic %(levelname)s %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _announce(state_dir: Path) -> Callable[[AgentInfo], None]:
    """With --json: one JSON line on stdout once the agent listens, for scripts that start it."""
    import json
    import os

    def announce(info: AgentInfo) -> None:
        line = {"url": info["url"], "state_dir": os.path.abspath(state_dir), "pid": info["pid"]}
        echo(json.dumps({**line, "version": info["version"]}), flush=True)

    return announce


def demo_banner(listen: str) -> str:
    """What the built-in demo is, said plainly: its windows are not production's."""
    return (
        "medic: no config given: running the built-in demo.\n"
        f"  demo-leaky grows {DEMO_LEAK_RATE}B/s against a {DEMO_LIMIT} memory limit; demo-slow answers "
        f"{DEMO_SLOW_DELAY} slower than its three peers.\n"
        f"  DEMO TIME: compressed {DEMO_TIME_SCALE}x (agent.time_scale: a 3 h trend window takes 30 s, a 1 h "
        "safety margin 10 s), so a slow and a leak\n"
        "  finding (with its suspect: what grows, and the line that allocates it) appear within 2 minutes, "
        "and medic restarts\n"
        "  demo-leaky before its limit (enforce mode: it acts only on the demo's own workloads); a real "
        "config keeps production windows.\n"
        f"  Dashboard: http://{listen}/   API and /metrics on the same address; "
        "in another shell: `medic status`, `medic leaks`, `medic plan`, `medic actions`. Ctrl-C stops."
    )


def run(args: argparse.Namespace) -> int:
    from native_hooks.glibc import tune_agent_allocator

    tune_agent_allocator()  # before the imports below fill the heap and before any thread starts
    import asyncio

    from agent.runtime import Agent
    from agent.watch.pid1 import become_init_if_pid1

    config, main, demo = build_config(args)
    become_init_if_pid1()  # in a container without an init, reap orphans from a process of its own
    configure_logging(args.log_level)
    announce = _announce(config.agent.state_dir) if args.json else None

    def on_listening(info: AgentInfo) -> None:
        """The banner names the bound address (`--port 0` picks one), then the JSON line if asked."""
        if demo:
            echo(demo_banner(info["url"].removeprefix("http://")), file=sys.stderr)
        if announce is not None:
            announce(info)

    agent = Agent(
        config,
        main_instance=main,
        config_path=args.config,
        on_listening=on_listening if demo or announce is not None else None,
    )
    return asyncio.run(agent.run())
