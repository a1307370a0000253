"""`medic demo`: what medic does, in minutes, on real onnxruntime inference servers.

medic demo                          2 healthy, 1 leaking, 1 slow server; narrate until Ctrl-C
medic demo --duration 5m            stop after five minutes, then print what happened
medic demo --until-restarted --json stop once medic restarted every sick server; one JSON report

The servers listen on loopback; the agent runs in enforce mode with compressed detection windows
(docs/demo.md), with its API and dashboard on --listen. Everything it starts is stopped on exit,
Ctrl-C or SIGTERM. Needs onnxruntime and onnx: `pip install -e '.[demo]'` in the checkout (or `make demo`).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from agent.cli.options import duration
from agent.core.errors import UsageError
from agent.core.text import echo
from agent.core.units import format_bytes, format_duration, parse_duration, parse_size

if TYPE_CHECKING:
    from agent.cli.client import ApiReply
    from agent.demo.config import DemoSettings
    from agent.demo.fleet import Fleet
    from agent.demo.load import TargetStats
    from agent.demo.narrate import ApiGet

HELP = "start real onnxruntime servers (healthy, leaking, slow) and narrate what medic finds and does"
POLL = 1.0
BACK_WAIT = 15.0  # seconds to wait, after the last restart, for its server to be seen back


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__
    parser.add_argument(
        "--duration", type=duration, help="stop after this long, e.g. 5m (default: until Ctrl-C)"
    )
    parser.add_argument(
        "--until-restarted",
        action="store_true",
        help="stop once medic has restarted every leaking and slow server once (or --duration passed)",
    )
    parser.add_argument("--json", action="store_true", help="narrate on stderr, print one JSON report")
    parser.add_argument("--listen", default="127.0.0.1:9464", help="the agent's API (port 0: any free one)")
    parser.add_argument("--state-dir", help="keep the agent's state here (default: a temp dir, removed)")
    parser.add_argument("--healthy", type=int, default=2, help="healthy servers (default 2)")
    parser.add_argument("--leak", type=int, default=1, help="leaking servers (default 1)")
    parser.add_argument("--slow", type=int, default=1, help="slowing servers (default 1)")
    parser.add_argument("--leak-rate", default="2Mi", help="bytes a second a leaking server keeps (2Mi)")
    parser.add_argument("--memory-limit", default="384Mi", help="each server's memory limit (384Mi)")
    parser.add_argument("--rps", type=float, default=10.0, help="requests a second to each server (10)")
    parser.add_argument(
        "--status-every", type=duration, default="15s", help="a one-line fleet status this often (0: never)"
    )


def settings_from(args: argparse.Namespace) -> DemoSettings:
    from agent.demo.config import DemoSettings

    try:
        leak_rate, limit = parse_size(args.leak_rate), parse_size(args.memory_limit)
    except ValueError as exc:
        raise UsageError(f"--leak-rate/--memory-limit: {exc}") from None
    return DemoSettings(
        healthy=args.healthy,
        leak=args.leak,
        slow=args.slow,
        rps=args.rps,
        leak_rate=leak_rate,
        memory_limit=limit,
        listen=args.listen,
    )


def _seconds(value: str | None, flag: str) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the demo like Ctrl-C: through the cleanup in `finally`


def run(args: argparse.Namespace) -> int:
    from agent.cli.client import get_json
    from agent.demo.fleet import Fleet
    from agent.demo.model import require_runtime
    from agent.demo.narrate import Narrator
    from agent.demo.report import collect, render

    duration = _seconds(args.duration, "--duration")
    status_every = _seconds(args.status_every, "--status-every") or 0.0
    settings = settings_from(args)
    require_runtime()
    out = sys.stderr if args.json else sys.stdout
    fleet = Fleet(settings, Path(args.state_dir) if args.state_dir else None)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    started = time.time()
    report: dict[str, Any] | None = None
    try:
        fleet.start()

        def get(path: str, /, **params: Any) -> ApiReply:
            return get_json(fleet.url, path, params)

        _say(out, _header(fleet))
        narrator = Narrator(get, status_every=status_every)
        sick = {s.name for s in fleet.servers if s.behaviour != "healthy"}
        all_restarted: float | None = None
        while duration is None or time.time() - started < duration:
            fleet.check()
            for line in narrator.poll(time.time()):
                _say(out, line.render())
            fleet.note_pids(list(narrator.pids.values()))
            if args.until_restarted and all_restarted is None and sick <= _restarted(get):
                all_restarted = time.time()
            # the last restarted server is told back with its memory before the demo stops
            if all_restarted is not None and (
                not narrator.restarts_untold or time.time() - all_restarted > BACK_WAIT
            ):
                _say(out, "every leaking and slow server has been restarted by medic: stopping")
                break
            time.sleep(POLL)
        report = collect(get, settings, fleet.servers, narrator.lines, _load(fleet), started, time.time())
    except KeyboardInterrupt:
        _say(out, "stopping the demo")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            fleet.close()
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, previous)
    if report is None:
        return 130
    if args.json:
        echo(json.dumps(report, indent=2))
    else:
        echo(render(report))
    return 0


def _header(fleet: Fleet) -> str:
    s = fleet.settings
    servers = ", ".join(f"{x.name} {x.behaviour} :{x.port}" for x in fleet.servers)
    return (
        f"medic demo: {len(fleet.servers)} onnxruntime servers on 127.0.0.1 ({servers})\n"
        f"  load: {s.rps:g} requests/s each, batch {s.batch}; leaking servers keep "
        f"{format_bytes(s.actual_leak_rate)}/s; memory limit {format_bytes(s.memory_limit)}; "
        f"p99 SLO {format_duration(s.slo)}\n"
        f"  agent: enforce mode, compressed windows; API and dashboard: {fleet.url}/\n"
        f"  state: {fleet.state_dir}{' (temporary)' if fleet.temporary else ''}; Ctrl-C stops"
    )


def _restarted(get: ApiGet) -> set[str]:
    actions = get("/api/v1/actions", limit=1000).get("actions") or []
    return {a.get("instance") for a in actions if a.get("outcome") == "succeeded"}


def _load(fleet: Fleet) -> dict[str, TargetStats]:
    return dict(fleet.load.stats) if fleet.load is not None else {}


def _say(out: TextIO, text: str) -> None:
    echo(text, file=out, flush=True)
