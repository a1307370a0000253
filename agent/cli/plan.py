"""`medic plan`: the restart plan (who, when, why, before which deadline), the budget, pause and escalations."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from agent.cli.client import agent_url, get_json
from agent.core.text import echo, printable, render
from agent.core.units import format_duration

HELP = "show the remediation plan: mode, pause, planned restarts against their deadlines, restarts in flight"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Only the shared options (`agent.cli.options`), which main adds."""


def _when(ts: float | None, now: float) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    clock = datetime.fromtimestamp(ts).strftime("%H:%M:%S")
    return (
        f"{clock} (in {format_duration(ts - now)})"
        if ts >= now
        else f"{clock} ({format_duration(now - ts)} ago)"
    )


def run(args: argparse.Namespace) -> int:
    body = get_json(agent_url(args.url, args.state_dir), "/api/v1/plan")
    if args.json:
        echo(json.dumps(body, indent=2))
        return 0
    now = body.get("now", 0.0)
    pause = body.get("paused")
    line = f"mode: {body.get('mode', '?')}"
    if pause:
        by, reason = printable(pause.get("by") or "?"), printable(pause.get("reason"))
        line += f"   PAUSED until {_when(pause.get('until'), now)} by {by}: {reason}"
    coordinator = body.get("coordinator") or {}
    if coordinator and not coordinator.get("ok", True):
        line += f"   COORDINATOR DOWN: {printable(coordinator.get('error'))} (no restarts until it answers)"
    echo(line)
    step = body.get("step") or {}
    plan = step.get("plan") or {}
    decisions = step.get("decisions") or {}
    entries = plan.get("entries") or []
    if entries:
        rows = [_row(e, decisions.get(e["instance"]), now) for e in entries]
        echo(render(["INSTANCE", "KIND", "PLANNED", "DEADLINE", "STATUS", "REASON"], rows))
    else:
        echo("no restarts planned")
    for problem in plan.get("problems") or []:
        echo(f"! {printable(problem)}")
    flights = {r.get("instance"): r for r in body.get("restarts_in_flight") or []}
    for name in body.get("in_progress") or []:
        flight = flights.get(name) or {}
        where = f" (action {flight['action_id']}, {flight.get('stage')})" if flight.get("action_id") else ""
        echo(f"restarting now: {printable(name)}{printable(where)}")
    for esc in body.get("escalations") or []:
        echo(
            f"escalated: {printable(esc.get('instance'))}: {printable(esc.get('hold') or esc.get('reason'))}"
        )
    return 0


def _row(entry: dict, decision: dict | None, now: float) -> list[str]:
    """One planned restart; a slot that is due but held (a blocker, the pause, the lock) says so."""
    status = "hopeless" if entry.get("hopeless") else ("late" if entry.get("late") else "on time")
    reason = entry.get("reason") or ""
    if decision and not decision.get("ok") and decision.get("stage") not in ("plan", None):
        status = f"{status}, held: {decision.get('code')}"
        retry = decision.get("retry_at")
        reason = decision.get("reason") or reason
        if isinstance(retry, (int, float)):
            reason += f" (retried {_when(retry, now)})"
    return [
        entry["instance"],
        entry.get("kind") or "-",
        _when(entry.get("slot_at"), now),
        _when(entry.get("deadline"), now),
        status,
        reason,
    ]
