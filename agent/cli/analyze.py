"""`medic analyze FILE...`: run the detectors offline on recorded series, as the agent would have.

Reads JSON Lines or Prometheus `query_range` exports (see `agent.series.reader`), replays the
online judgement tick by tick (`agent.detect.analyze`) and lists, per instance, each finding
with the time it would first have fired. Bad lines are reported on stderr and skipped, unless
`--strict`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from typing import Any, TextIO

from agent.cli.options import duration
from agent.core.text import echo, printable

HELP = (
    "Run the leak, OOM-risk and fragmentation detectors on recorded series (JSON Lines or Prometheus export)."
)

LIMIT_METRIC = "memory_limit_bytes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", nargs="+", metavar="FILE", help="JSON Lines or Prometheus query_range JSON (.gz ok)"
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
    from agent.detect import DetectParams, analyze
    from agent.series.reader import collector_paused, read_files

    spans: dict[str, float] = {}
    for name in ("window", "long_window", "horizon", "warmup"):
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
    result = read_files(args.files, strict=args.strict, label=args.label, progress=progress.reading)
    if not result.points:
        first = "".join(f"\n  {problem}" for problem in result.problems[:5])
        raise SeriesFormatError(
            f"no samples found in {', '.join(args.files)}"
            + (
                f" ({result.problem_count} malformed lines or series skipped){first}"
                if result.problem_count
                else ""
            )
        )
    instances = result.instances(memory_limit=limit)
    missing_limit = _apply_limit_metric(instances, args.limit_metric) if limit is None else []
    with collector_paused():
        analyses = analyze(instances, params, progress=progress.analysing)
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


def _apply_limit_metric(instances: list, name: str | None) -> list[str]:
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


def _finding_row(f: Any, opened: Any, start: float | None) -> dict[str, str]:
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


def _table(analyses: list, points: int, elapsed: float, missing_limit: list[str]) -> str:
    from agent.core.units import format_duration

    columns = ["instance", "kind", "verdict", "severity", "first fired (UTC)", "after", "resolved", "slope", "%/h",
               "time to OOM", "confidence"]  # fmt: skip
    rows = []
    for a in analyses:
        if not a.findings:
            span = format_duration(a.last_ts - a.first_ts) if a.first_ts is not None else "-"
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
    return "\n".join(lines) + "\n"


def _json_report(analyses: list, params: Any, result: Any, missing_limit: list[str], elapsed: float) -> dict:
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

    def analysing(self, done: int, total: int) -> None:
        self._show(f"analysing {done}/{total} instances", force=done >= total)

    def done(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 60 + "\r")
            self.stream.flush()
