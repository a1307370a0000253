"""`medic guardrail`: does the candidate build leak, fragment, slow down or fail more than the baseline?

    medic guardrail --baseline 'python -m server --port {port}' \\
                    --candidate 'venv-new/bin/python -m server --port {port}' \\
                    --requests warmup/ --duration 10m --rate 50/s --ready-url /healthz \\
                    --report guardrail.html --junit guardrail.xml

Both builds run side by side on free loopback ports ({port}), get the same requests (the warm-up
request files of `medic warmup`), first for --warmup, then for --duration in --rounds rounds whose
order alternates (ABBA). Memory, allocator figures and CPU come from medic's probes; latency from the
client (and the servers' own histogram with --histogram). Exit status: 0 no regression, 1 a
regression, 2 a usage error, 3 a server did not start or died (its last output is shown).
Both servers are stopped at the end, on Ctrl-C and SIGTERM too. docs/guardrail.md has the details.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import TYPE_CHECKING, Any

from agent.cli.options import duration
from agent.core.errors import UsageError
from agent.core.text import echo

if TYPE_CHECKING:
    from agent.guardrail.options import Options

HELP = (
    "run a candidate build beside the baseline on the same requests; fail on a leak, slowdown or more errors"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__
    add = parser.add_argument
    add("--baseline", metavar="CMD", help="command that starts the baseline build; must hold {port}")
    add("--candidate", metavar="CMD", help="command that starts the candidate build; must hold {port}")
    add("--baseline-url", help="a baseline already running (with --baseline-pid)")
    add("--baseline-pid", type=int, help="its process, for memory and CPU")
    add("--candidate-url", help="a candidate already running (with --candidate-pid)")
    add("--candidate-pid", type=int)
    add(
        "--requests",
        required=True,
        metavar="DIR",
        help="request files, as for `medic warmup` (.http or bodies)",
    )
    add("--duration", type=duration, default="10m", help="measured time, split into the rounds (default 10m)")
    add("--warmup", type=duration, default="1m", help="requests before measuring, not judged (default 1m)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", help="request pairs a second, e.g. 50/s (default 20/s)")
    load.add_argument("--concurrency", type=int, help="workers sending pairs back to back")
    add(
        "--rounds",
        type=int,
        default=2,
        help="measured rounds, alternating which build goes first (default 2)",
    )
    add("--ready-url", help="path that answers 2xx once a build is ready (default: the port accepts)")
    add("--start-timeout", type=duration, default="60s", help="how long a build may take to be ready (60s)")
    add("--timeout", type=duration, default="10s", help="timeout of one request (10s)")
    add("--limit", default="4Gi", help="memory limit a leak is projected against (default 4Gi)")
    add(
        "--histogram",
        help="the builds' own latency histogram at --metrics-path, e.g. request_latency_seconds",
    )
    add("--metrics-path", default="/metrics", help="where the builds serve Prometheus text (/metrics)")
    add("--max-slowdown", default="10%", help="p50 worse than this is slower (10%%)")
    add("--max-slowdown-p99", default="20%", help="p99 worse than this is slower (20%%)")
    add("--max-cpu-increase", default="20%", help="CPU seconds per request (20%%)")
    add("--max-error-increase", default="0.1%", help="error ratio, in percentage points (0.1%%)")
    add("--max-peak-increase", default="10%", help="peak RSS, relative (10%%), and at least --peak-min more")
    add("--peak-min", default="32Mi", help="smallest peak RSS increase that counts (32Mi)")
    add("--leak-threshold", default="256Ki/min", help="growth that counts as a leak (256Ki/min)")
    add("--confidence", default="99%", help="confidence of the statistical tests (99%%)")
    add("--bootstrap", type=int, default=1000, help="bootstrap resamples (1000)")
    add("--json", action="store_true", help="print the result as JSON on stdout (progress stays on stderr)")
    add("--report", metavar="FILE", help="write a self-contained HTML report")
    add("--junit", metavar="FILE", help="write JUnit XML, one test case per verdict")
    add("--quiet", "-q", action="store_true", help="no progress lines")


def options_from(args: argparse.Namespace) -> Options:
    from agent.core.units import parse_size
    from agent.guardrail.options import (
        MAX_CONCURRENCY,
        MAX_DURATION,
        MAX_ROUNDS,
        MIN_DURATION,
        Options,
        Thresholds,
        load_request_set,
        parse_fraction,
        parse_leak_rate,
        parse_rate,
        parse_ready_url,
        parse_span,
        server_spec,
    )

    baseline = server_spec("baseline", args.baseline, args.baseline_url, args.baseline_pid)
    candidate = server_spec("candidate", args.candidate, args.candidate_url, args.candidate_pid)
    measured = parse_span(args.duration, "--duration", MIN_DURATION, MAX_DURATION)
    warmup = parse_span(args.warmup, "--warmup", 0.0, MAX_DURATION)
    if not 1 <= args.rounds <= MAX_ROUNDS:
        raise UsageError(f"--rounds: between 1 and {MAX_ROUNDS}, got {args.rounds}")
    if measured / args.rounds < 2.0:
        raise UsageError(f"--rounds: {args.rounds} rounds leave under 2s each of a {measured:g}s --duration")
    if args.concurrency is not None and not 1 <= args.concurrency <= MAX_CONCURRENCY:
        raise UsageError(f"--concurrency: between 1 and {MAX_CONCURRENCY}, got {args.concurrency}")
    rate = None if args.concurrency is not None else parse_rate(args.rate or "20/s")
    if not 0 <= args.bootstrap <= 100_000:
        raise UsageError(f"--bootstrap: between 0 and 100000 resamples, got {args.bootstrap}")
    try:
        limit = parse_size(args.limit)
        peak_min = parse_size(args.peak_min)
    except ValueError as exc:
        raise UsageError(f"--limit/--peak-min: {exc}") from None
    if limit <= 0:
        raise UsageError("--limit: a memory size above 0, such as 4Gi")
    confidence = parse_fraction(args.confidence, "--confidence", 1.0)
    if not 0.5 <= confidence < 1:
        raise UsageError(f"--confidence: between 50% and 99.99%, got {args.confidence!r}")
    thresholds = Thresholds(
        slower_p50=parse_fraction(args.max_slowdown, "--max-slowdown"),
        slower_p99=parse_fraction(args.max_slowdown_p99, "--max-slowdown-p99"),
        cpu=parse_fraction(args.max_cpu_increase, "--max-cpu-increase"),
        errors=parse_fraction(args.max_error_increase, "--max-error-increase", 1.0),
        peak=parse_fraction(args.max_peak_increase, "--max-peak-increase"),
        peak_bytes=float(peak_min),
        leak_rate=parse_leak_rate(args.leak_threshold),
        confidence=confidence,
    )
    if args.histogram is not None and not args.histogram.replace("_", "a").replace(":", "a").isalnum():
        raise UsageError(
            f"--histogram: a metric family name such as request_latency_seconds, got {args.histogram!r}"
        )
    return Options(
        baseline=baseline,
        candidate=candidate,
        requests=load_request_set(args.requests),
        requests_dir=args.requests,
        duration=measured,
        warmup=warmup,
        rate=rate,
        concurrency=args.concurrency,
        rounds=args.rounds,
        ready_url=parse_ready_url(args.ready_url),
        limit=limit,
        start_timeout=parse_span(args.start_timeout, "--start-timeout", 0.5, 3600.0),
        timeout=parse_span(args.timeout, "--timeout", 0.05, 600.0),
        histogram=args.histogram,
        metrics_path=parse_ready_url(args.metrics_path) or "/metrics",
        thresholds=thresholds,
        bootstrap=args.bootstrap,
    )


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: stop both servers, then exit."""


def _on_term(signum: int, frame: object) -> None:
    raise Terminated()


def run(args: argparse.Namespace) -> int:
    from agent.guardrail.report import html_report, junit_server_failure, junit_xml, table, write_private
    from agent.guardrail.run import guard
    from agent.guardrail.servers import ServerFailed

    options = options_from(args)
    for path, flag in ((args.report, "--report"), (args.junit, "--junit")):
        if path:
            _check_writable(path, flag)
    tty = sys.stderr.isatty()
    shown: dict[str, float] = {}

    def progress(phase: str, done: float, total: float, figures: dict[str, Any]) -> None:
        if args.quiet:
            return
        step = max(1.0, total / 10) if not tty else 0.0
        if not tty and done - shown.get(phase, -step) < step:
            return
        shown[phase] = done
        counts = "  ".join(f"{name} {f['requests']} req {f['errors']} err" for name, f in figures.items())
        line = f"guardrail: {phase}: {done:5.0f}/{total:.0f}s  {counts}"
        echo(line, file=sys.stderr, end="\r" if tty else "\n", flush=True)

    previous = signal.signal(signal.SIGTERM, _on_term)
    try:
        try:
            result = guard(options, progress)
        except ServerFailed as exc:
            if args.junit:
                write_private(args.junit, junit_server_failure(exc.name, str(exc)))
            raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        if tty and not args.quiet:
            echo("", file=sys.stderr)
    if args.report:
        write_private(args.report, html_report(result))
    if args.junit:
        write_private(args.junit, junit_xml(result))
    if args.json:
        echo(json.dumps(result.to_dict(), indent=1, default=str))
    else:
        echo(table(result))
    return result.exit_code


def _check_writable(path: str, flag: str) -> None:
    """Refuse an output path that cannot be written before minutes of measuring, not after."""
    from pathlib import Path

    target = Path(path)
    if target.is_dir() or not target.parent.is_dir():
        raise UsageError(f"{flag}: {path} is a directory or its directory does not exist")
    if target.is_symlink():
        raise UsageError(f"{flag}: {path} is a symbolic link; give a plain file path")
