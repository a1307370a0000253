"""`medic status`: the fleet this agent watches, in one table."""

from __future__ import annotations

import argparse
import json

from agent.cli.client import agent_url, get_json
from agent.core.text import echo, render
from agent.core.units import format_bytes, format_duration

HELP = "show every watched instance: pid, uptime, memory against its limit, CPU, probe health"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Only the shared options (`agent.cli.options`), which main adds."""


def run(args: argparse.Namespace) -> int:
    body = get_json(agent_url(args.url, args.state_dir), "/api/v1/instances")
    instances = body.get("instances", [])
    if args.json:
        echo(json.dumps(body, indent=2))
        return 0
    if not instances:
        echo("no instances configured; give a config with `medic run --config FILE` or a command after `--`")
        return 0
    rows = []
    for inst in instances:
        ratio = inst.get("memory_used_ratio")
        cpu = inst.get("cpu_percent")
        limit = inst.get("memory_limit_bytes")
        rows.append(
            [
                inst["name"],
                inst.get("pid"),
                inst["status"]
                if inst["status"] == "up"
                else f"{inst['status']} ({inst.get('status_reason')})",
                format_duration(inst.get("uptime_seconds")),
                format_bytes(inst.get("rss_bytes")),
                _limit(inst, limit),
                f"{100 * ratio:.1f}%" if ratio is not None else "-",
                f"{cpu:.1f}" if cpu is not None else "-",
                _ms(inst.get("latest", {}).get("latency_p99_seconds")),
                inst.get("threads") if inst.get("threads") is None else int(inst["threads"]),
                inst.get("restarts"),
                format_duration(inst.get("last_probe_age_seconds")),
                inst.get("probe_errors_total"),
            ]
        )
    headers = ["INSTANCE", "PID", "STATUS", "UPTIME", "RSS", "LIMIT", "%LIMIT", "CPU%", "P99", "THREADS"]
    echo(render([*headers, "RESTARTS", "PROBED", "ERRORS"], rows, numeric={1, 4, 6, 7, 8, 9, 10, 12}))
    return 0


def _limit(inst: dict, limit: float | None) -> str:
    """The memory limit and where it came from; for a JVM, its heap's own ceiling too."""
    text = f"{format_bytes(limit)} {inst.get('memory_limit_source') or ''}".strip() if limit else "-"
    heap = next((c for c in inst.get("ceilings") or [] if c.get("layer") == "jvm_heap"), None)
    if heap is None:
        return text
    return f"{text}, -Xmx {format_bytes(heap['bytes'])}" if heap.get("bytes") else f"{text}, -Xmx unknown"


def _ms(seconds: float | None) -> str:
    """Latency for the table: `42ms`, `1.25s`, `-` when the instance has no latency source."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:.2f}s"
