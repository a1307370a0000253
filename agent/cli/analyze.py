"""`medic analyze FILE...`: run the detectors offline on recorded series, as the agent would have.

Reads JSON Lines or Prometheus `query_range` exports (see `agent.series.reader`), or pulls the
same from a Prometheus server (`--prometheus URL --query Q`, `agent.series.prometheus_pull`),
replays the online judgement tick by tick (`agent.detect.analyze`) and lists, per instance, each
finding with the time it would first have fired. Bad lines are reported on stderr and skipped,
unless `--strict`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Literal, TextIO, TypedDict

from agent.cli.options import duration, when
from agent.core.text import echo, printable

if TYPE_CHECKING:
    from agent.detect.model import Finding, InstanceAnalysis, InstanceSeries
    from agent.detect.params import DetectParams
    from agent.series.records import ImportResult

HELP = (
    "Run the leak, OOM-risk and fragmentation detectors on recorded series (JSON Lines or Prometheus export)."
)

LIMIT_METRIC = "memory_limit_bytes"
SpanName = Literal["window", "long_window", "horizon", "warmup"]
SPAN_OPTIONS: tuple[SpanName, ...] = ("window", "long_window", "horizon", "warmup")
FleetOf = Callable[["InstanceSeries"], str]


class Spans(TypedDict, total=False):
    """The detector durations given on the command line, in seconds: the rest keep their defaults."""

    window: float
    long_window: float
    horizon: float
    warmup: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", nargs="*", metavar="FILE", help="JSON Lines or Prometheus query_range JSON (.gz ok)"
    )
    source = parser.add_argument_group("reading from a Prometheus server instead of files")
    source.add_argument(
        "--prometheus", metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:9090"
    )
    source.add_argument("--query", metavar="PROMQL", help="one memory series per instance, e.g. rss_bytes")
    source.add_argument(
        "--start", type=instant, metavar="WHEN", help="a span ago (14d), a unix time or ISO 8601 (default 8d)"
    )
    source.add_argument("--end", type=instant, metavar="WHEN", help="as --start, or now (the default)")
    source.add_argument("--step", type=duration, metavar="DURATION", help="resolution (default 1m)")
    source.add_argument(
        "--bearer-token-file", metavar="FILE", help="file (0600) with a token sent as Authorization: Bearer"
    )
    source.add_argument(
        "--ca-file", metavar="FILE", help="CA bundle for an https:// server (default: the system's)"
    )
    parser.add_argument(
        "--limit", metavar="SIZE", help="memory limit of every instance, e.g. 4Gi (else from the file)"
    )
    parser.add_argument(
        "--limit-metric",
        metavar="NAME",
        help=f"metric in the file that holds each instance's limit (default {LIMIT_METRIC} or cgroup_memory_limit_bytes)",
    )
    parser.add_argument(
        "--label",
        metavar="NAME",
        help="Prometheus label naming the instance (default: instance, pod, name, job)",
    )
    parser.add_argument(
        "--window", type=duration, metavar="DURATION", help="span of the short trend fit (default 6h)"
    )
    parser.add_argument(
        "--long-window", type=duration, metavar="DURATION", help="span of the slow-leak fit (default 48h)"
    )
    parser.add_argument(
        "--horizon",
        type=duration,
        metavar="DURATION",
        help="oom-risk fires when OOM is nearer than this (default 24h)",
    )
    parser.add_argument(
        "--warmup",
        type=duration,
        metavar="DURATION",
        help="growth ignored after each process start (default 30m)",
    )
    parser.add_argument(
        "--fleet-label",
        metavar="NAME",
        help="label that groups instances into fleets (workloads) for fleet evidence and priors "
        "(default: all instances of the input are one fleet)",
    )
    slo = parser.add_argument_group(
        "latency (series latency_p99_seconds and the other quantiles, or the canary's)"
    )
    slo.add_argument(
        "--slo", type=duration, metavar="DURATION", help="the SLO threshold, e.g. 250ms (default: none)"
    )
    slo.add_argument(
        "--slo-quantile", type=float, choices=[0.5, 0.9, 0.99, 0.999], default=0.99, help="the SLO's quantile"
    )
    slo.add_argument(
        "--slo-for", type=duration, metavar="DURATION", help="over the threshold this long (default 5m)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON: per instance, the findings and when each fired"
    )
    parser.add_argument(
        "--strict", action="store_true", help="stop at the first malformed line instead of skipping it"
    )
    parser.add_argument(
        "--progress", action="store_true", help="show progress on stderr even when it is not a terminal"
    )


def run(args: argparse.Namespace) -> int:
    from agent.core.errors import SeriesFormatError, UsageError
    from agent.core.units import parse_duration, parse_size
    from agent.detect import DetectParams
    from agent.detect.memory.fleet import analyze_fleet
    from agent.detect.slow.rules import QUANTILE_METRICS
    from agent.series.buckets import quantiles_from_columns
    from agent.series.reader import collector_paused, read_files

    spans: Spans = {}
    for name in SPAN_OPTIONS:
        if getattr(args, name) is not None:
            try:
                spans[name] = parse_duration(getattr(args, name))
            except ValueError as exc:
                raise UsageError(
                    f"detection option {name}: {exc}; durations look like 30m, 6h or 3d"
                ) from None
    try:
        params = DetectParams(**spans)
    except ValueError as exc:
        raise UsageError(f"{exc}; durations look like 30m, 6h or 3d") from None
    limit = None
    if args.limit is not None:
        try:
            limit = float(parse_size(args.limit))
        except ValueError as exc:
            raise UsageError(f"--limit: {exc}") from None
        if limit <= 0:
            raise UsageError("--limit must be positive, e.g. --limit 4Gi")
    progress = Progress(sys.stderr, enabled=args.progress or sys.stderr.isatty())
    started = time.monotonic()
    if args.prometheus is not None:
        if args.files:
            raise UsageError("give recorded FILEs or --prometheus URL, not both")
        result = _pull(args, progress)
        sources = f"{args.prometheus} {args.query!r}"
    elif not args.files:
        raise UsageError("give recorded FILEs, or --prometheus URL --query PROMQL to read from a server")
    else:
        result = read_files(args.files, strict=args.strict, label=args.label, progress=progress.reading)
        sources = ", ".join(args.files)
    result.drop_times_out_of_range()
    if not result.points:
        first = "".join(f"\n  {problem}" for problem in result.problems[:5])
        raise SeriesFormatError(
            f"no samples found in {sources}"
            + (
                f" ({result.problem_count} malformed lines or series skipped){first}"
                if result.problem_count
                else ""
            )
        )
    # histogram buckets in the input: the interval quantile the slow detector judges (the SLO's),
    # made from the reader's arrays and the buckets dropped before any point tuple is made
    quantiles_from_columns(result, wanted=[QUANTILE_METRICS[args.slo_quantile if args.slo else 0.99]])
    instances = result.instances(memory_limit=limit)
    missing_limit = _apply_limit_metric(instances, args.limit_metric) if limit is None else []
    with collector_paused():
        analyses = analyze_fleet(
            instances, params, fleet_of=_fleet_of(result, args.fleet_label), progress=progress.analysing
        )
        _judge_latency(instances, analyses, _fleet_of(result, args.fleet_label), args)
    progress.done()
    elapsed = time.monotonic() - started
    for problem in result.problems:
        echo(f"medic: skipped {printable(problem)}", file=sys.stderr)
    if result.problem_count > len(result.problems):
        echo(f"medic: ... and {result.problem_count - len(result.problems)} more", file=sys.stderr)
    if args.json:
        doc = _json_report(analyses, params, result, missing_limit, elapsed)
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        echo(_table(analyses, result.points, elapsed, missing_limit), end="")
    return 0


def instant(text: str) -> str:
    """An argparse type: what `when` accepts (a span ago, a unix time), an ISO 8601 time, or `now`."""
    if text.strip().lower() == "now":
        return "now"
    try:
        _iso(text)
        return text
    except ValueError:
        return when(text)


def _iso(text: str) -> float:
    moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _resolve(text: str, now: float) -> float:
    """The unix time an `instant` names."""
    from agent.core.units import parse_duration

    if text == "now":
        return now
    try:
        return _iso(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return now - parse_duration(text)
    return number if number >= 1e9 else now - number


def _pull(args: argparse.Namespace, progress: Progress) -> ImportResult:
    """The series of `--query` over [--start, --end] from `--prometheus`, with the agent's bounds."""
    from pathlib import Path

    from agent.core.errors import UsageError
    from agent.core.units import parse_duration
    from agent.series.prometheus_pull import PullSpec, pull_range
    from probes.linux.secrets import client_tls_context, read_token

    if not args.query:
        raise UsageError("--prometheus needs --query PROMQL, e.g. --query rss_bytes")
    now = time.time()
    end = _resolve(args.end, now) if args.end else now
    start = _resolve(args.start, now) if args.start else end - 8 * 86400
    headers = {}
    if args.bearer_token_file:
        token = read_token(Path(args.bearer_token_file), "--bearer-token-file")
        headers["Authorization"] = f"Bearer {token}"
    context = client_tls_context(Path(args.ca_file), None, None, "--ca-file") if args.ca_file else None
    spec = PullSpec(
        url=args.prometheus,
        query=args.query,
        start=start,
        end=end,
        step=parse_duration(args.step) if args.step else 60.0,
        headers=headers,
        ssl_context=context,
        label=args.label,
        metric="rss_bytes",
        max_samples=50_000_000,
        max_bytes=16 * 2**30,
        deadline=1800.0,
    )
    return pull_range(spec, strict=args.strict, progress=progress.pulling)


def _judge_latency(
    instances: list[InstanceSeries],
    analyses: list[InstanceAnalysis],
    fleet_of: FleetOf | None,
    args: argparse.Namespace,
) -> None:
    """The slow detector over the latency series of the input, with the same fleets as memory."""
    from agent.core.errors import UsageError
    from agent.core.units import parse_duration
    from agent.detect.slow.replay import analyze_slow
    from agent.detect.slow.rules import Slo

    slo = None
    if args.slo is not None:
        threshold = parse_duration(args.slo)
        window = parse_duration(args.slo_for) if args.slo_for else 300.0
        if threshold <= 0 or window <= 0:
            raise UsageError("--slo and --slo-for must be positive, e.g. --slo 250ms --slo-for 5m")
        slo = Slo(args.slo_quantile, threshold, window)
    elif args.slo_for:
        raise UsageError("--slo-for needs --slo THRESHOLD")
    groups: dict[str, list[InstanceSeries]] = {}
    for series in instances:
        groups.setdefault(fleet_of(series) if fleet_of else "", []).append(series)
    analyze_slow(
        [groups[key] for key in sorted(groups)],
        {a.instance: a for a in analyses},
        slos=dict.fromkeys((s.instance for s in instances), slo),
    )


def _fleet_of(result: ImportResult, label: str | None) -> FleetOf | None:
    """Each instance's fleet: its `label` label (instances without it form one fleet), else one
    fleet for the whole input."""
    if label is None:
        return None
    return lambda series: result.labels.get(series.instance, {}).get(label, "")


def _apply_limit_metric(instances: list[InstanceSeries], name: str | None) -> list[str]:
    """Use `name` as each instance's limit series; the instances that lack it."""
    missing = []
    for series in instances:
        if name is not None:
            points = series.series.get(name)
            if points:
                series.series[LIMIT_METRIC] = points
            else:
                missing.append(series.instance)
        elif not series.series.get(LIMIT_METRIC) and not series.series.get("cgroup_memory_limit_bytes"):
            missing.append(series.instance)
    return missing


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def _finding_row(f: Finding, opened: Finding, start: float | None) -> dict[str, str]:
    """A finding as a table row, with the figures it had when it opened (what the alert said)."""
    from agent.core.units import format_bytes, format_duration

    e = opened.evidence
    slope = e.get("slope_bytes_per_second")
    ttoom = e.get("time_to_oom_seconds")
    since = format_duration(f.opened_at - start) if f.opened_at is not None and start is not None else "-"
    return {
        "kind": f.kind,
        "verdict": f.verdict or "-",
        "severity": opened.severity,
        "first fired (UTC)": _when(f.opened_at),
        "after": "+" + since,
        "resolved": _when(f.resolved_at),
        "slope": f"{format_bytes(slope * 3600)}/h" if slope is not None else "-",
        "%/h": f"{e['pct_per_hour']:.2f}" if e.get("pct_per_hour") is not None else "-",
        "time to OOM": format_duration(ttoom) if ttoom is not None else "-",
        "confidence": f"{e['confidence']:.3f}" if e.get("confidence") is not None else "-",
    }


def _table(analyses: list[InstanceAnalysis], points: int, elapsed: float, missing_limit: list[str]) -> str:
    from agent.core.units import format_duration

    columns = ["instance", "kind", "verdict", "severity", "first fired (UTC)", "after", "resolved", "slope", "%/h",
               "time to OOM", "confidence"]  # fmt: skip
    rows = []
    for a in analyses:
        if not a.findings:
            first, last = a.first_ts, a.last_ts  # both None when the series has no samples
            span = format_duration(last - first) if first is not None and last is not None else "-"
            rows.append({"instance": a.instance, "kind": f"no findings ({span} of data)"})
        for f in a.findings:
            rows.append({"instance": a.instance, **_finding_row(f, a.at_open.get(f.id, f), a.first_ts)})
    widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip()]
    for r in rows:
        lines.append("  ".join(r.get(c, "").ljust(widths[c]) for c in columns).rstrip())
    total = sum(len(a.findings) for a in analyses)
    lines.append("")
    lines.append(
        f"{len(analyses)} instances, {points} samples, {total} findings, analysed in {elapsed:.1f}s"
        " (first fired: when the agent would have opened the finding; figures as they were then)"
    )
    if missing_limit:
        shown = ", ".join(missing_limit[:5]) + (" ..." if len(missing_limit) > 5 else "")
        lines.append(
            f"no memory limit for {len(missing_limit)} instances ({shown}): oom-risk not judged; use --limit"
        )
    for a in analyses:
        for note in a.notes:
            if not note.startswith("fragmentation: cannot judge"):
                lines.append(f"{a.instance}: {note}")
    for a in analyses:
        for f in a.findings:
            if f.kind == "slow":  # its figures are latencies: say them in a sentence
                lines.append(f"{_when(f.opened_at)} {printable(a.at_open.get(f.id, f).summary)}")
    return "\n".join(lines) + "\n"


def _json_report(
    analyses: list[InstanceAnalysis],
    params: DetectParams,
    result: ImportResult,
    missing_limit: list[str],
    elapsed: float,
) -> dict[str, object]:
    instances = []
    for a in analyses:
        doc = a.to_dict()
        for f in doc["findings"]:
            f["first_fired"] = f["opened_at"]
        instances.append(doc)
    return {
        "params": params.to_dict(),
        "samples": result.points,
        "seconds": round(elapsed, 3),
        "instances": instances,
        "instances_without_limit": missing_limit,
        "problems": {"count": result.problem_count, "first": [str(p) for p in result.problems[:20]]},
    }


class Progress:
    """One status line on stderr, rewritten in place; silent unless enabled."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self.last = 0.0
        self.shown = False

    def _show(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < 0.2):
            return
        self.last = now
        self.shown = True
        self.stream.write(f"\r{text:<60}")
        self.stream.flush()

    def reading(self, done: int, total: int) -> None:
        self._show(f"reading {done * 100 // max(total, 1)}% of {total / 1e6:.1f} MB", force=done >= total)

    def pulling(self, done: int, total: int) -> None:
        self._show(f"pulling {done}/{total} chunks", force=done >= total)

    def analysing(self, done: int, total: int) -> None:
        self._show(f"analysing {done}/{total} instances", force=done >= total)

    def done(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 60 + "\r")
            self.stream.flush()
