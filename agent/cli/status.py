"""`medic status [NAME]`: the fleet this agent watches, in one table; with NAME, one instance and the
processes it is made of (its server and workers), with what each holds."""

from __future__ import annotations

import argparse
import json

from agent.cli.client import ApiReply, agent_url, get_json
from agent.core.text import echo, render
from agent.core.units import format_bytes, format_duration

HELP = "show every watched instance: pid, uptime, memory against its limit, CPU, probe health"
# what the table shows of each instance (the API sends these alone; --json gets every field)
TABLE_FIELDS = (
    "name",
    "pid",
    "status",
    "status_reason",
    "uptime_seconds",
    "memory_bytes",
    "rss_bytes",
    "workers",
    "worker_restarts",
    "memory_limit_bytes",
    "memory_limit_source",
    "memory_used_ratio",
    "cpu_percent",
    "latest",
    "threads",
    "restarts",
    "last_probe_age_seconds",
    "probe_errors_total",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="one instance, with its processes (server and workers)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "name", None):
        return _one(args)
    url = agent_url(args.url, args.state_dir)
    if args.json:
        echo(json.dumps(get_json(url, "/api/v1/instances"), indent=2))
        return 0
    body = get_json(url, "/api/v1/instances", params={"fields": ",".join(TABLE_FIELDS)})
    instances = body.get("instances", [])
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
                format_bytes(inst.get("memory_bytes", inst.get("rss_bytes"))),
                _processes(inst),
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
    headers = ["INSTANCE", "PID", "STATUS", "UPTIME", "MEMORY", "PROCS", "LIMIT", "%LIMIT", "CPU%", "P99"]
    echo(
        render(
            [*headers, "THREADS", "RESTARTS", "PROBED", "ERRORS"],
            rows,
            numeric={1, 4, 5, 7, 8, 9, 10, 11, 13},
        )
    )
    return 0


def _processes(inst: ApiReply) -> str | int | None:
    """How many processes the instance is (its own and its workers), and how many workers ended."""
    if inst.get("status") != "up":
        return None
    count = 1 + int(inst.get("workers") or 0)
    ended = int(inst.get("worker_restarts") or 0)
    return f"{count} ({ended} ended)" if ended else count


def _one(args: argparse.Namespace) -> int:
    body = get_json(agent_url(args.url, args.state_dir), f"/api/v1/instances/{args.name}")
    inst = body["instance"]
    if args.json:
        echo(json.dumps(body, indent=2))
        return 0
    limit = inst.get("memory_limit_bytes")
    ratio = inst.get("memory_used_ratio")
    status = inst["status"] if inst["status"] == "up" else f"{inst['status']} ({inst.get('status_reason')})"
    source = {
        "cgroup": "its cgroup's working set (the instance owns the cgroup)",
        "pss": "its processes' RSS less the pages they share (PSS)",
        "rss": "its process's RSS",
    }.get(inst.get("memory_source") or "", "-")
    echo(f"{inst['name']}: {status}, pid {inst.get('pid')}, up {format_duration(inst.get('uptime_seconds'))}")
    echo(
        f"memory {format_bytes(inst.get('memory_bytes'))}"
        + (f" of {format_bytes(limit)} ({inst.get('memory_limit_source')})" if limit else "")
        + (f", {100 * ratio:.1f}%" if ratio is not None else "")
        + f": {source}"
    )
    extra = []
    if inst.get("worker_restarts"):
        extra.append(f"{inst['worker_restarts']} worker(s) ended while the server ran on")
    if inst.get("workers_not_followed"):
        extra.append(f"{inst['workers_not_followed']} descendant(s) beyond match.max_children not followed")
    if extra:
        echo("; ".join(extra))
    processes = inst.get("processes") or []
    if not processes:
        return 0
    rows = [
        [
            p.get("pid"),
            p.get("role"),
            format_duration(p.get("age_seconds")),
            format_bytes(p.get("rss_bytes")),
            format_bytes(p.get("pss_bytes")),
            format_bytes(p.get("memory_bytes")),
            p.get("command"),
        ]
        for p in processes
    ]
    echo("")
    echo(render(["PID", "ROLE", "AGE", "RSS", "PSS", "COUNTS", "COMMAND"], rows, numeric={0, 3, 4, 5}))
    return 0


def _limit(inst: ApiReply, limit: float | None) -> str:
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
