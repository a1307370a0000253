"""`medic evidence ACTION [ITEM]`: what was captured before a restart: `finding.json` (the finding
whole: id, kind, verdict, summary, suspects, attribution), the heap profile, histograms,
smaps_rollup, the series window. Without ITEM it lists the items and summarizes the finding; with
ITEM it prints that item (or writes it to `--output`)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import Any

from agent.cli.client import agent_url, get_json
from agent.core.errors import UsageError
from agent.core.text import echo, printable, render

HELP = "list or print the evidence captured before a restart (`medic actions` gives the ids)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", help="the action id (`medic actions`)")
    parser.add_argument("item", nargs="?", help="an item to print, e.g. finding, heap_profile.sites")
    parser.add_argument("--output", "-o", help="write the item to this file (0600) instead of printing it")


def _action_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(
            f"ACTION: expected an action id (a number, from `medic actions`), got {text!r}"
        ) from None
    if not 1 <= value <= 2**62:
        raise UsageError(f"ACTION: expected a positive action id, got {text!r}")
    return value


def _suspect_names(finding: dict[str, Any]) -> str:
    names = [str(s.get("name")) for s in finding.get("suspects") or [] if isinstance(s, dict)]
    return ", ".join(names[:3]) or "-"


def run(args: argparse.Namespace) -> int:
    action_id = _action_id(args.action)
    url = agent_url(args.url, args.state_dir)
    if args.item:
        item = get_json(url, f"/api/v1/actions/{action_id}/evidence/{args.item}", timeout=10.0)
        data = (
            base64.b64decode(item["content"])
            if item.get("encoding") == "base64"
            else item["content"].encode()
        )
        if args.output:
            fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            echo(f"wrote {len(data)} bytes to {printable(args.output)}")
        elif args.json:
            echo(json.dumps(item, indent=2))
        elif item.get("encoding") == "base64":
            raise UsageError(f"{args.item} is binary ({len(data)} bytes): write it with --output FILE")
        else:
            sys.stdout.write(printable(data.decode("utf-8"), newlines=True))
            if not data.endswith(b"\n"):
                echo("")
        return 0
    action = get_json(url, f"/api/v1/actions/{action_id}")["action"]
    items = action.get("evidence") or []
    if args.json:
        echo(json.dumps(items, indent=2))
        return 0
    echo(
        f"action {action_id}: {printable(action.get('action'))} of {printable(action.get('instance'))}, "
        f"{printable(action.get('outcome'))}: {printable(action.get('reason'))}"
    )
    if not items:
        echo("no evidence (none was captured, or it was pruned: remediation.evidence.keep)")
        return 0
    rows = [
        [
            i.get("name") or "-",
            str(i.get("bytes", 0)) + (" (truncated)" if i.get("truncated") else ""),
            i.get("path") or "-",
            i.get("error") or "",
        ]
        for i in items
    ]
    echo(render(["ITEM", "BYTES", "PATH", "ERROR"], rows))
    if any(i.get("name") == "finding" and i.get("path") for i in items):
        finding = json.loads(get_json(url, f"/api/v1/actions/{action_id}/evidence/finding")["content"])
        attribution = finding.get("attribution") or {}
        echo(
            f"finding {printable(finding.get('id'))} ({printable(finding.get('kind'))}, verdict "
            f"{printable(finding.get('verdict') or '-')}): {printable(finding.get('summary'))}"
        )
        echo(f"suspects: {printable(_suspect_names(finding))}")
        if isinstance(attribution, dict) and attribution.get("summary"):
            echo(f"attribution: {printable(attribution.get('summary'))}")
    echo(f"`medic evidence {action_id} ITEM` prints one item")
    return 0
