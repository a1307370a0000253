"""`medic histo NAME [--diff 1h]`: an instance's latest class/type histogram and its suspects, or what
changed since a time ago."""

from __future__ import annotations

import argparse
import json

from agent.cli.client import ApiReply, agent_url, get_json
from agent.cli.options import when
from agent.core.text import echo, held_by_text, printable, render
from agent.core.units import format_bytes, format_duration

HELP = "show an instance's object histogram (JVM classes, Python types) and what grows"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the instance")
    parser.add_argument(
        "--diff", type=when, metavar="AGO", help="compare the latest histogram with the one AGO (e.g. 1h)"
    )
    parser.add_argument(
        "--kind", choices=["class", "type", "container", "nmt"], help="histogram kind (default: the newest)"
    )
    parser.add_argument("--since", type=when, default="6h", help="window for suspects (default 6h)")
    parser.add_argument("--top", type=int, default=20, help="rows to show (default 20)")


def run(args: argparse.Namespace) -> int:
    url = agent_url(args.url, args.state_dir)
    base = f"/api/v1/instances/{args.name}"
    if args.diff:  # without --kind, the agent compares the kind the instance has
        params = {"from": args.diff, "top": args.top, **({"kind": args.kind} if args.kind else {})}
        body = get_json(url, f"{base}/histograms/diff", params)
        if args.json:
            echo(json.dumps(body, indent=2))
        elif body.get("pending"):  # no data yet is an answer, not an error
            echo(f"{args.name}: no {body.get('kind')} histogram diff yet: {printable(body['pending'])}")
        else:
            echo(render_diff(body))
        return 0
    params = {"top": args.top, "since": args.since}
    if args.kind:
        params["kind"] = args.kind
    body = get_json(url, f"{base}/histograms", params)
    suspects = get_json(url, f"{base}/suspects", {"since": args.since})
    if args.json:
        echo(json.dumps({**body, "suspects": suspects["suspects"]}, indent=2))
        return 0
    latest = body.get("latest") or {}
    kinds = [args.kind] if args.kind else [k for k in ("class", "type", "nmt") if k in latest]
    if not kinds or not any(k in latest for k in kinds):
        echo(f"{args.name}: no histograms yet (JVM targets: jvm probe; Python targets: the in-process hook)")
    for kind in kinds:
        if kind in latest:
            echo(render_snapshot(latest[kind]))
            echo()
    echo(render_suspects(suspects["suspects"]))
    return 0


def render_snapshot(snapshot: ApiReply) -> str:
    if snapshot["kind"] == "nmt":  # NMT categories: committed bytes, no object counts
        rows = [[i + 1, format_bytes(row["bytes"]), row["name"]] for i, row in enumerate(snapshot["rows"])]
        committed = format_bytes(snapshot["total_bytes"])
        head = f"{snapshot['instance']} NMT categories (pid {snapshot['pid']}), {committed} committed"
        return head + "\n" + render(["#", "COMMITTED", "CATEGORY"], rows, numeric={0, 1})
    rows = [
        [i + 1, f"{row['count']:.0f}", format_bytes(row["bytes"]), row["name"]]
        for i, row in enumerate(snapshot["rows"])
    ]
    head = (
        f"{snapshot['instance']} {snapshot['kind']} histogram ({snapshot['source']}, pid {snapshot['pid']}), "
        f"{snapshot['total_count']:.0f} objects, {format_bytes(snapshot['total_bytes'])}"
    )
    return head + "\n" + render(["#", "COUNT", "BYTES", "NAME"], rows, numeric={0, 1, 2})


def render_diff(body: ApiReply) -> str:
    seconds = body["seconds"]
    rows = []
    for row in body["rows"]:
        rate = row.get("bytes_per_second")
        rows.append(
            [
                _signed(row["delta_count"]),
                _signed_bytes(row["delta_bytes"]),
                "-" if rate is None else _signed_bytes(rate * 3600) + "/h",
                f"{row['count_after']:.0f}",
                format_bytes(row["bytes_after"]),
                row["name"] + (" ~" if row.get("approximate") else ""),
            ]
        )
    head = (
        f"{body['instance']} {body['kind']}: {format_duration(seconds)} between snapshots "
        f"{body['before']['id']} and {body['after']['id']}, total {_signed_bytes(body['delta_bytes'])}"
    )
    if not body.get("same_process", True):
        head += " (the process restarted in between)"
    return (
        head
        + "\n"
        + render(["ΔCOUNT", "ΔBYTES", "RATE", "COUNT", "BYTES", "NAME"], rows, numeric={0, 1, 2, 3, 4})
    )


def render_suspects(suspects: list[ApiReply]) -> str:
    if not suspects:
        return "suspects: none grows steadily (need at least 4 snapshots of one process)"
    rows = [
        [
            i + 1,
            s["kind"],
            _signed_bytes(s["bytes_per_hour"]) + "/h",
            f"{s['count_per_second'] * 3600:+.0f}/h",
            "-" if s["share"] is None else f"{100 * s['share']:.0f}%",
            f"{s['confidence']:.3f}",
            " ".join(filter(None, (s["name"], held_by_text(s.get("held_by")) or _filled_at(s)))),
        ]
        for i, s in enumerate(suspects)
    ]
    return "suspects:\n" + render(
        ["#", "KIND", "GROWTH", "OBJECTS", "SHARE", "CONF", "NAME"], rows, numeric={0, 2, 3, 4, 5}
    )


def _filled_at(suspect: ApiReply) -> str:
    """Where a Python container suspect is filled (`filled at app.py:41`)."""
    return f"filled at {suspect['added_at']}" if suspect.get("added_at") else ""


def _signed(value: float) -> str:
    return f"{value:+.0f}"


def _signed_bytes(value: float) -> str:
    return ("+" if value >= 0 else "") + format_bytes(value)
