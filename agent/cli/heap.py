"""`medic heap NAME [--base 1h]`: which native allocation sites grew (the agent's heap-profile snapshots), and
in which memory layer the instance grows. `medic heap --file NEW.heap [--base-file OLD.heap]` does the same
for dump files on this machine, without an agent (like `jeprof --text --base=OLD BINARY NEW`)."""

from __future__ import annotations

import argparse
import json
import os

from agent.cli.client import agent_url, get_json
from agent.cli.histo import render_diff, render_suspects
from agent.cli.options import when
from agent.core.errors import ApiError, UsageError
from agent.core.text import echo, printable, render
from agent.core.units import format_bytes

HELP = "show which native allocation sites grew between two heap profiles, and where memory grows"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="the instance (omit with --file)")
    parser.add_argument(
        "--base",
        type=when,
        default="1h",
        metavar="WHEN",
        help="the older profile: a time ago or unix time (default 1h)",
    )
    parser.add_argument(
        "--since", type=when, default="6h", help="window for suspects and attribution (default 6h)"
    )
    parser.add_argument("--file", metavar="HEAP", help="a jemalloc or gperftools dump to read locally")
    parser.add_argument("--base-file", metavar="HEAP", help="with --file: the older dump to diff against")
    parser.add_argument(
        "--frames", type=int, default=1, help="with --file: frames that name a site (default 1)"
    )
    parser.add_argument("--top", type=int, default=20, help="rows to show (default 20)")


def run(args: argparse.Namespace) -> int:
    if args.file:
        return _local(args)
    if not args.name:
        raise UsageError("give an instance name, or --file DUMP for a local heap profile")
    url = agent_url(args.url, args.state_dir)
    base = f"/api/v1/instances/{args.name}"
    attribution = get_json(url, f"{base}/attribution", {"since": args.since})  # also: the instance exists
    suspects = get_json(url, f"{base}/suspects", {"since": args.since, "kind": "site"})
    try:
        body: dict = get_json(url, f"{base}/heap/diff", {"from": args.base, "top": args.top})
    except ApiError as exc:  # no heap profiles (yet): the layers still say where memory grows
        body = {"instance": args.name, "kind": "site", "error": str(exc)}
    if args.json:
        echo(json.dumps({**body, "attribution": attribution, "suspects": suspects["suspects"]}, indent=2))
        return 0
    echo(render_diff(body) if "rows" in body else f"{args.name}: no heap diff: {printable(body['error'])}")
    echo()
    echo(render_suspects(suspects["suspects"]))
    echo()
    echo(render_attribution(attribution))
    return 0


def render_attribution(body: dict) -> str:
    rows = [
        [
            layer["name"],
            format_bytes(layer["bytes"]),
            ("+" if layer["bytes_per_hour"] >= 0 else "") + format_bytes(layer["bytes_per_hour"]) + "/h",
            f"{layer['confidence']:.3f}",
            layer["title"],
        ]
        for layer in body.get("layers", [])
    ]
    rss = body.get("rss_bytes")
    head = f"memory layers of {body['instance']}: RSS {format_bytes(rss)}"
    if body.get("rss_bytes_per_hour") is not None:
        per_hour = body["rss_bytes_per_hour"]
        head += f", {'+' if per_hour >= 0 else ''}{format_bytes(per_hour)}/h"
    lines = [
        head,
        render(["LAYER", "BYTES", "GROWTH", "CONF", "WHAT"], rows, numeric={1, 2, 3}),
        body["verdict"],
    ]
    lines.extend(f"missing: {item}" for item in body.get("missing", []))
    return "\n".join(lines)


def _local(args: argparse.Namespace) -> int:
    from agent.core.histograms import HistogramRow, Snapshot
    from agent.detect.histodiff import diff
    from native_hooks.heapprofile import read_heap_profile
    from native_hooks.heapsites import allocation_sites
    from native_hooks.symbolize import Symbolizer

    symbolizer = Symbolizer()

    def snapshot(path: str) -> Snapshot:
        profile = read_heap_profile(path)
        sites = allocation_sites(profile, symbolizer, max(1, args.frames))
        rows = [HistogramRow(s.name, s.live_objects, s.live_bytes, " ← ".join(s.stack)) for s in sites]
        mtime = os.stat(path).st_mtime
        return Snapshot(
            path, profile.format, mtime, rows, profile.live_objects, profile.live_bytes, None, None, len(rows)
        )

    after = snapshot(args.file)
    before = (
        snapshot(args.base_file)
        if args.base_file
        else Snapshot(args.file, after.source, after.ts, [], 0.0, 0.0)
    )
    result = diff(before, after)
    if args.json:
        echo(json.dumps({"instance": None, "kind": "site", **result.to_dict(args.top)}, indent=2))
        return 0
    title = f"{args.file}" + (f" against {args.base_file}" if args.base_file else "")
    echo(
        f"{title}: {format_bytes(after.total_bytes)} live, {_signed(after.total_bytes - before.total_bytes)}"
    )
    rows = [
        [_signed(r.delta_bytes), format_bytes(r.bytes_after), f"{r.count_after:.0f}", r.name]
        for r in result.rows[: args.top]
    ]
    echo(render(["ΔBYTES", "BYTES", "OBJECTS", "SITE"], rows, numeric={0, 1, 2}))
    return 0


def _signed(value: float) -> str:
    return ("+" if value >= 0 else "") + format_bytes(value)
