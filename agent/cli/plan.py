"""`medic plan`: the restart plan (who, when, why, before which deadline), the budget, this agent's
and the fleet's pause, the namespace's elected planner, people's restart requests and what holds
them, every other instance the last step held (and why), and escalations."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from agent.cli.client import ApiReply, agent_url, get_json
from agent.core.text import echo, printable, render
from agent.core.units import format_duration

HELP = (
    "show the remediation plan: mode, pause (this agent's and the fleet's), the fleet's planner, "
    "planned restarts against their deadlines, restarts in flight"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Only the shared options (`agent.cli.options`), which main adds."""


def _when(ts: float | None, now: float) -> str:
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not 0 <= ts <= 4102444800:
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
    budget = body.get("budget") or {}
    if budget.get("text"):
        echo(f"budget: {printable(budget['text'])}")
    fleet = body.get("fleet")
    if isinstance(fleet, dict):
        for fleet_line in _fleet(fleet, now):
            echo(fleet_line)
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
    for request in body.get("requests") or []:
        echo(_request(request, now))
    planned = {e.get("instance") for e in entries}
    for name, decision in sorted(decisions.items()):
        if name not in planned and isinstance(decision, dict) and not decision.get("ok"):
            echo(f"held: {printable(name)}: {_held(decision, now)}")
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


def _fleet(fleet: ApiReply, now: float) -> list[str]:
    """The namespace's pause and its elected planner, as the agent's last step read them."""
    lines = []
    namespace = printable(fleet.get("namespace") or "?")
    pause = fleet.get("paused")
    if isinstance(pause, dict):
        until = pause.get("until")
        till = _when(until, now) if until is not None else "lifted (`medic resume --fleet`)"
        on = f" on {printable(pause['agent'])}" if pause.get("agent") else ""
        lines.append(
            f"FLEET PAUSED (namespace {namespace}) until {till} by {printable(pause.get('by') or '?')}{on}: "
            f"{printable(pause.get('reason'))}"
        )
    leader = fleet.get("leader")
    if not fleet.get("shared", True):
        lines.append("planner: this agent (no other agent shares its coordinator)")
    elif isinstance(leader, dict):
        who = printable(leader.get("agent") or "?") + (" (this agent)" if fleet.get("leads") else "")
        since = f" since {_when(leader.get('since'), now)}" if leader.get("since") is not None else ""
        revision = leader.get("revision")
        fence = f", revision {printable(revision)}" if revision is not None else ""
        lines.append(f"planner of namespace {namespace}: {who}{since}{fence}")
    elif fleet.get("error"):
        lines.append(f"planner of namespace {namespace}: unknown ({printable(fleet['error'])})")
    elif fleet.get("role") == "alone":
        lines.append(f"planner of namespace {namespace}: none (dry-run: every agent plans for itself)")
    else:
        lines.append(f"planner of namespace {namespace}: none elected yet")
    return lines


def _request(request: ApiReply, now: float) -> str:
    """A person's restart request still waiting: who asked, when, and what holds it."""
    by = printable(request.get("requested_by") or "an operator")
    detail = printable(request.get("detail") or "waiting for the next remediation step")
    return (
        f"request: {printable(request.get('instance'))}: {printable(request.get('kind'))} restart asked by "
        f"{by} {_when(request.get('requested_at'), now)} ({printable(request.get('reason'))}; action "
        f"{printable(request.get('action_id'))}): {detail}"
    )


def _held(decision: ApiReply, now: float) -> str:
    """A refusal in a few words: its stage and code, its reason, and when it is tried again."""
    text = f"{printable(decision.get('stage'))}/{printable(decision.get('code'))}: {printable(decision.get('reason'))}"
    retry = decision.get("retry_at")
    if isinstance(retry, (int, float)):
        text += f" (tried again {_when(retry, now)})"
    return text


def _row(entry: ApiReply, decision: ApiReply | None, now: float) -> list[str]:
    """One planned restart; a slot held (a blocker, the pause, the lock, or the budget limit that
    moved it: `held: cooldown`) says so, and so does dry-run's would-be restart (nothing was
    restarted)."""
    status = "hopeless" if entry.get("hopeless") else ("late" if entry.get("late") else "on time")
    reason = entry.get("reason") or ""
    if entry.get("dry_run"):
        status = "would restart (dry-run)"
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
