"""`medic leaks [NAME]`: open memory findings (leak, oom-risk, fragmentation) with slope, time to OOM
and confidence, the top suspect and where the growth is (the attribution), newest first; under the
table, what holds the suspects (Python containers and the line that adds to them) and what a finding
waits for (allocation sites being collected, or why their tracing ended)."""

from __future__ import annotations

import argparse
import json
import time

from agent.cli.client import ApiReply, agent_url, get_json
from agent.core.text import echo, held_by_text, printable, render
from agent.core.units import format_bytes, format_duration

HELP = "show open memory findings: leaks with their slope and time to OOM, fragmentation, OOM risk"
MEMORY_KINDS = ("leak", "oom-risk", "fragmentation")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="only this instance")
    parser.add_argument("--all", action="store_true", help="include resolved findings")


def _rate(bytes_per_second: float | None) -> str:
    if not isinstance(bytes_per_second, (int, float)):
        return "-"
    per_hour = bytes_per_second * 3600
    return f"{format_bytes(per_hour)}/h"


def _time_to_oom(evidence: ApiReply) -> str:
    """`5h40m`; `0s (at its limit)` at an enforced limit; `past its limit` past a config-only one,
    where when the kernel would kill the process is not known."""
    ttoom = evidence.get("time_to_oom_seconds")
    if evidence.get("above_limit"):
        return "0s (at its limit)" if isinstance(ttoom, (int, float)) else "past its limit"
    return format_duration(ttoom)


def _suspect(evidence: ApiReply) -> str:
    """The top suspect of a leak: what grows, how much of the growth it explains, and what holds it."""
    suspects = evidence.get("suspects") or []
    if not suspects or not isinstance(suspects[0], dict):
        return "-"
    top = suspects[0]
    share = top.get("share")
    held = held_by_text(top.get("held_by"))
    named = f"{top.get('name')}" + (f" ({100 * share:.0f}%)" if isinstance(share, (int, float)) else "")
    return f"{named} {held}" if held else named


def notes(finding: ApiReply, now: float) -> list[str]:
    """Lines said under the table about one finding: what holds its first suspects and the line that
    adds to it, and what it waits for (allocation sites being collected, or why their tracing ended)."""
    evidence = finding.get("evidence") or {}
    out = []
    for suspect in (evidence.get("suspects") or [])[:3]:
        if not isinstance(suspect, dict):
            continue
        held = held_by_text(suspect.get("held_by"))
        if held:
            out.append(f"{suspect.get('name')} is {held}")
        elif suspect.get("added_at"):
            out.append(
                f"{suspect.get('name')} ({suspect.get('detail') or suspect.get('kind')}) is filled at {suspect['added_at']}"
            )
    waiting = evidence.get("collecting")
    if isinstance(waiting, dict) and waiting.get("message"):
        line = f"collecting {waiting.get('what') or 'allocation sites'}: {waiting['message']}"
        expected = waiting.get("expected_at")
        if waiting.get("state") == "tracing" and isinstance(expected, (int, float)):
            line += f"; a suspect is expected {'now' if expected <= now else 'in ' + format_duration(expected - now)}"
        out.append(line)
    return [f"{finding['instance']} {finding['kind']}: {line}" for line in out]


def _attribution(evidence: ApiReply) -> str:
    """Where the growth is, in a few words: the attribution's verdict up to its advice."""
    verdict = (evidence.get("attribution") or {}).get("verdict")
    if not isinstance(verdict, str) or not verdict:
        return "-"
    return verdict.split(":", 1)[0].removeprefix("growth is ")


def run(args: argparse.Namespace) -> int:
    params = {"state": "all" if args.all else "open"}
    if args.name:
        params["instance"] = args.name
    body = get_json(agent_url(args.url, args.state_dir), "/api/v1/findings", params)
    findings = [f for f in body["findings"] if f["kind"] in MEMORY_KINDS]
    if args.json:
        echo(json.dumps(findings, indent=2))
        return 0
    if not findings:
        echo("no open memory findings" + (f" for {args.name}" if args.name else ""))
        return 0
    now = body.get("now", time.time())
    rows = []
    for f in findings:
        ev = f.get("evidence") or {}
        pct = ev.get("pct_per_hour")
        conf = ev.get("confidence")
        rows.append(
            [
                f["instance"],
                f["kind"],
                f.get("verdict") or "-",
                _rate(ev.get("slope_bytes_per_second")),
                f"{pct:+.2f}" if isinstance(pct, (int, float)) else "-",
                _time_to_oom(ev),
                f"{100 * conf:.1f}%" if isinstance(conf, (int, float)) else "-",
                format_duration(now - f["opened_at"]) + " ago" if f.get("opened_at") else "-",
                f["state"],
                _suspect(ev),
                _attribution(ev),
                f["summary"],
            ]
        )
    headers = [
        "INSTANCE",
        "KIND",
        "VERDICT",
        "SLOPE",
        "%/H",
        "TIME-TO-OOM",
        "CONFIDENCE",
        "SINCE",
        "STATE",
        "SUSPECT",
        "ATTRIBUTION",
        "SUMMARY",
    ]
    echo(render(headers, rows, numeric={3, 4, 5, 6}))
    said = [line for f in findings for line in notes(f, now)]
    if said:  # under the table, after a blank line: what holds the suspects, what a finding waits for
        echo("\n" + "\n".join(printable(line) for line in said))
    return 0
