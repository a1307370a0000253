"""`medic heap NAME [--base 1h]`: which allocation sites grew (the agent's heap-profile snapshots of native
targets, or the tracemalloc snapshots of Python ones), and in which memory layer the instance grows.
`medic heap NAME --sites 15m` starts tracing Python allocation sites in the target now (through its hook,
on this machine; the agent then takes a snapshot every `histograms.python.sites.interval` and the session
stops itself after the duration); `--stop-sites` ends it early. `medic heap --file NEW.heap [--base-file
OLD.heap]` reads dump files on this machine, without an agent (like `jeprof --text --base=OLD BINARY NEW`)."""

from __future__ import annotations

import argparse
import json
import os

from agent.cli.client import ApiReply, agent_url, get_json
from agent.cli.histo import render_diff, render_suspects
from agent.cli.options import duration, when
from agent.core.errors import ApiError, UsageError
from agent.core.text import echo, printable, render
from agent.core.units import format_bytes

HELP = "show which allocation sites grew (native heap profiles, Python tracemalloc), and where memory grows"


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
    parser.add_argument(
        "--sites",
        type=duration,
        metavar="DURATION",
        help="Python targets: trace allocation sites for this long (e.g. 15m; at most 6h), starting now",
    )
    parser.add_argument(
        "--sites-frames", type=int, default=5, help="with --sites: frames kept per allocation (default 5)"
    )
    parser.add_argument("--stop-sites", action="store_true", help="Python targets: stop tracing now")


def run(args: argparse.Namespace) -> int:
    if args.file:
        return _local(args)
    if not args.name:
        raise UsageError("give an instance name, or --file DUMP for a local heap profile")
    url = agent_url(args.url, args.state_dir)
    base = f"/api/v1/instances/{args.name}"
    if args.sites or args.stop_sites:
        return _sites(args, get_json(url, base)["instance"])
    attribution = get_json(url, f"{base}/attribution", {"since": args.since})  # also: the instance exists
    suspects = get_json(url, f"{base}/suspects", {"since": args.since, "kind": "site"})
    try:
        body: ApiReply = get_json(url, f"{base}/heap/diff", {"from": args.base, "top": args.top})
    except ApiError as exc:  # no heap profiles (yet): the layers still say where memory grows
        body = {"instance": args.name, "kind": "site", "error": str(exc)}
    if args.json:
        echo(json.dumps({**body, "attribution": attribution, "suspects": suspects["suspects"]}, indent=2))
        return 0
    if body.get("pending") or "rows" not in body:
        echo(f"{args.name}: no heap diff: {printable(body.get('pending') or body.get('error'))}")
    else:
        echo(render_diff(body))
    echo()
    echo(render_suspects(suspects["suspects"]))
    echo()
    echo(render_attribution(attribution))
    return 0


def _sites(args: argparse.Namespace, instance: ApiReply) -> int:
    """Start or stop the tracemalloc session in the instance's process, through its hook."""
    from agent.core.units import parse_duration
    from native_hooks.client import HookClient
    from native_hooks.errors import HOOK_HOWTO, HookNotFound
    from native_hooks.sockets import find_socket

    pid = instance.get("pid")
    if not isinstance(pid, int) or instance.get("status") != "up":
        raise UsageError(f"{args.name} has no running process (status {instance.get('status')})")
    configured = ((instance.get("settings") or {}).get("hook") or {}).get("socket")
    path = configured.replace("%p", str(pid)) if configured else find_socket(pid)
    if path is None:
        raise HookNotFound(f"no hook socket found for {args.name} (pid {pid}): {HOOK_HOWTO}")
    with HookClient(path, 10.0, pid=pid) as client:
        if args.stop_sites:
            reply = client.request("sites_stop")
        else:
            seconds = parse_duration(args.sites)
            if not 1 <= seconds <= 6 * 3600 or not 1 <= args.sites_frames <= 25:
                raise UsageError("--sites takes 1s to 6h, --sites-frames 1 to 25")
            reply = client.request("sites_start", frames=args.sites_frames, duration_s=seconds)
    if args.json:
        echo(json.dumps(reply, indent=2))
    elif reply.get("tracing"):
        echo(
            f"{args.name} (pid {pid}): tracing allocation sites with {reply['frames']} frames for "
            f"{reply['remaining_s']:.0f}s more; the agent snapshots them, `medic heap {args.name}` "
            "shows the growing ones as suspects"
        )
    else:
        echo(
            f"{args.name} (pid {pid}): not tracing allocation sites ({printable(str(reply.get('stopped_reason')))})"
        )
    return 0


def render_attribution(body: ApiReply) -> str:
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
    from agent.detect.explain.histodiff import diff
    from native_hooks.heapprofile import HeapProfileError, read_heap_profile
    from native_hooks.heapsites import allocation_sites
    from native_hooks.symbolize import Symbolizer

    symbolizer = Symbolizer()

    def snapshot(path: str) -> Snapshot:
        try:
            profile = read_heap_profile(path)
        except HeapProfileError as exc:  # a file given on the command line is input, like `medic analyze`'s
            raise UsageError(str(exc)) from None
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
