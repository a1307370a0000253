"""`medic actions [NAME]`: what remediation did (purges, restarts, dry-run's would-be restarts,
escalations) and people's restart requests from the moment they were asked (`held` with what holds
them), newest first, with each restart's stages (evidence → drain → act → verify → warm-up) and
evidence."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from agent.cli.client import agent_url, get_json
from agent.core.text import echo, printable, render

HELP = "list remediation actions (restarts, purges, escalations, held requests), stages and evidence"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="only this instance's actions")
    parser.add_argument("--limit", "-n", type=int, default=20, help="at most this many (default 20)")
    parser.add_argument("--stages", action="store_true", help="print every stage of each action")


def when(ts: Any) -> str:
    return datetime.fromtimestamp(ts).strftime("%m-%d %H:%M:%S") if isinstance(ts, (int, float)) else "-"


def warmup_summary(action: dict[str, Any]) -> str:
    """The warm-up stage in a few words: `warm after 12 requests`, `NOT warm (...)`, or ''."""
    stage = next((s for s in action.get("stages") or [] if s.get("stage") == "warmup"), None)
    if stage is None:
        return ""
    data = stage.get("data") or {}
    if stage.get("ok"):
        return f"warm after {data.get('requests', '?')} requests in {data.get('elapsed_seconds', 0):.1f}s"
    return f"NOT warm: {stage.get('reason')}"


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 10_000:
        from agent.core.errors import UsageError

        raise UsageError("--limit: give between 1 and 10000")
    params: dict[str, Any] = {"limit": args.limit}
    if args.name:
        params["instance"] = args.name
    body = get_json(agent_url(args.url, args.state_dir), "/api/v1/actions", params)
    actions = body.get("actions") or []
    if args.json:
        echo(json.dumps(actions, indent=2))
        return 0
    if not actions:
        echo(f"no actions{' for ' + printable(args.name) if args.name else ''}")
        return 0
    rows = []
    for a in actions:
        evidence = [e for e in a.get("evidence") or [] if e.get("path")]
        detail = warmup_summary(a) or a.get("detail") or a.get("reason") or ""
        rows.append(
            [
                str(a["id"]),
                when(a.get("created_at")),
                a.get("instance") or "-",
                a.get("action") or "-",
                a.get("mode") or "-",
                a.get("outcome") or "-",
                f"{len(evidence)} item(s)" if evidence else "-",
                detail,
            ]
        )
    echo(render(["ID", "WHEN", "INSTANCE", "ACTION", "MODE", "OUTCOME", "EVIDENCE", "DETAIL"], rows))
    if args.stages:
        for a in actions:
            for stage in a.get("stages") or []:
                mark = "ok " if stage.get("ok") else "NO "
                echo(
                    f"  {a['id']:>5} {mark}{printable(stage.get('stage'))} ({stage.get('seconds', 0):.1f}s): "
                    f"{printable(stage.get('reason'))}"
                )
    echo("`medic evidence ID` lists an action's evidence")
    return 0
