"""The demo's narration: what the agent found and did, one line each, read from its API like the
dashboard and the CLI read it (events, the plan, the instances).

The `describe_*` functions are pure (a dict from the API in, a line or None out) and never raise
on odd input: a field that is missing or of the wrong type gives a shorter line, not a crash.
`Narrator.poll(now)` asks the API and returns the new lines in order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.core.units import format_bytes, format_duration

# events told as they are (their message already says what happened and why)
TOLD = {
    "remediation_restart_failed",
    "remediation_restart_interrupted",
    "remediation_restart_skipped",
    "remediation_escalated",
    "remediation_plan_infeasible",
    "remediation_budget_exhausted",
    "remediation_paused",
    "remediation_resumed",
    "remediation_coordinator_unavailable",
    "instance_down",
    "instance_exited",
    "instance_launch_failed",
}
PLAN_MOVED = 10.0  # a planned slot that moves more than this is told again
SUSPECT_KINDS = {"site": "allocation site", "type": "Python type", "class": "class"}
MAX_LINE = 220


class ApiGet(Protocol):
    """`get(path, **params)`: one GET of the agent's API and the JSON object it answers."""

    def __call__(self, path: str, /, **params: object) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Line:
    ts: float
    kind: str
    text: str
    instance: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "kind": self.kind, "instance": self.instance, "text": self.text}

    def render(self) -> str:
        return f"{clock(self.ts)}  {self.text}"


def clock(ts: float) -> str:
    """Local wall-clock time, HH:MM:SS."""
    try:
        return time.strftime("%H:%M:%S", time.localtime(ts))
    except (OverflowError, OSError, ValueError):
        return "--:--:--"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def _text(value: object, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _fields(value: object) -> dict[str, object]:
    """`value` when it is a JSON object, else an empty one: a field of the wrong type reads as absent."""
    return value if isinstance(value, dict) else {}


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"


def describe_finding(finding: object) -> str | None:
    """One line for an opened finding: leaks with their rate and time to OOM, others by their summary."""
    if not isinstance(finding, dict):
        return None
    name = _text(finding.get("instance"), "?")
    kind = _text(finding.get("kind"), "finding")
    evidence = _fields(finding.get("evidence"))
    slope = _number(evidence.get("slope_bytes_per_second"))
    if kind == "leak" and slope is not None:
        line = f"{name} leaks {format_bytes(slope * 60)}/min"
        tto = _number(evidence.get("time_to_oom_seconds"))
        limit = _number(evidence.get("limit_bytes"))
        if evidence.get("above_limit"):
            line += ", already past its limit" + (f" {format_bytes(limit)}" if limit is not None else "")
        elif tto is not None:
            line += f", projected OOM in {format_duration(tto)}"
            if limit is not None:
                line += f" (limit {format_bytes(limit)})"
        return _short(line)
    summary = _text(finding.get("summary"))
    return _short(summary) if summary else f"{name}: {kind} finding opened"


def top_suspect(finding: object) -> dict[str, Any] | None:
    """The first suspect a memory finding names, or None."""
    evidence = finding.get("evidence") if isinstance(finding, dict) else None
    suspects = evidence.get("suspects") if isinstance(evidence, dict) else None
    first = suspects[0] if isinstance(suspects, list) and suspects else None
    return first if isinstance(first, dict) and isinstance(first.get("name"), str) else None


def describe_suspect(finding: object) -> str | None:
    """`serving-2: what grows: FILE:LINE (allocation site, +1.2 MiB/h)`: the finding's first suspect."""
    suspect = top_suspect(finding)
    if suspect is None or not isinstance(finding, dict):  # a suspect comes only from a finding object
        return None
    name = _text(finding.get("instance"), "?")
    kind = SUSPECT_KINDS.get(_text(suspect.get("kind")), _text(suspect.get("kind"), "suspect"))
    rate = _number(suspect.get("bytes_per_hour"))
    count = _number(suspect.get("count_per_second"))
    said = [kind]
    if rate is not None:
        said.append(f"+{format_bytes(rate)}/h")
    if count is not None:
        said.append(f"+{count * 3600:.0f} objects/h")
    return _short(f"{name}: what grows: {suspect['name']} ({', '.join(said)})")


def describe_event(event: object) -> str | None:
    """One line for an event worth telling in a demo, or None for the rest (probe noise, ...)."""
    if not isinstance(event, dict):
        return None
    kind = _text(event.get("kind"))
    name = _text(event.get("instance"), "?")
    message = _text(event.get("message"))
    data = _fields(event.get("data"))
    if kind == "finding_opened":
        return describe_finding(data.get("finding"))
    if kind == "finding_resolved":
        finding = _fields(data.get("finding"))
        reason = _text(data.get("reason")) or "cleared"
        return _short(f"{name}: {_text(finding.get('kind'), 'finding')} finding resolved ({reason})")
    if kind == "remediation_restart_started":
        return _short(f"{name}: {message}")
    if kind == "remediation_restart_succeeded":
        return _short(f"{name}: restarted by medic; {message.removeprefix('restart succeeded: ')}")
    if kind == "instance_restarted" and "medic" not in message:
        return _short(f"{name}: {message}")
    if kind in TOLD:
        return _short(f"{name}: {message}" if event.get("instance") else message)
    return None


def describe_plan_entry(entry: object) -> str | None:
    """`restart of serving-2 planned at 12:03:10 (leak, OOM projected 12:04:30)`."""
    if not isinstance(entry, dict):
        return None
    name = _text(entry.get("instance"), "?")
    slot = _number(entry.get("slot_at"))
    if slot is None or slot in (float("inf"), float("-inf")):
        return _short(f"restart of {name} cannot be scheduled: {_text(entry.get('reason'))}")
    if entry.get("dry_run"):
        return _short(f"dry-run: would have restarted {name} at {clock(slot)} (nothing was restarted)")
    line = f"restart of {name} planned at {clock(slot)}"
    why = [_text(entry.get("kind"))] if entry.get("kind") else []
    deadline = _number(entry.get("deadline"))
    if deadline is not None:
        why.append(f"OOM projected {clock(deadline)}")
    if entry.get("after"):
        why.append(f"after {_text(entry.get('after'))}")
    if entry.get("late") or entry.get("hopeless"):
        why.append("LATE: cannot meet its deadline")
    return _short(line + (f" ({', '.join(why)})" if why else ""))


def status_line(instances: object) -> str | None:
    """`serving-0 71 MiB p99 2ms | serving-2 163 MiB/384 MiB | …`: memory and latency at a glance."""
    if not isinstance(instances, list):
        return None
    parts = []
    for inst in instances:
        if not isinstance(inst, dict):
            continue
        part = _text(inst.get("name"), "?")
        if inst.get("status") not in (None, "up"):
            parts.append(f"{part} {_text(inst.get('status'), 'down')}")
            continue
        rss = _number(inst.get("rss_bytes"))
        part += f" {format_bytes(rss)}"
        latest = _fields(inst.get("latest"))
        p99 = _number(latest.get("latency_p99_seconds"))
        if p99 is not None:
            part += f" p99 {p99 * 1000:.0f}ms"
        parts.append(part)
    return " | ".join(parts) if parts else None


@dataclass
class Narrator:
    """Turns the agent's API into narration lines; `get(path, **params) -> dict` does the HTTP."""

    get: ApiGet
    status_every: float = 15.0
    lines: list[Line] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    _after_id: int = 0
    _planned: dict[str, float] = field(default_factory=dict)  # instance -> slot told, until it restarts
    _rss: dict[str, float] = field(default_factory=dict)  # last RSS seen per instance
    _before: dict[str, tuple[int | None, float | None]] = field(default_factory=dict)  # pid, RSS at restart
    _succeeded: set[str] = field(default_factory=set)  # restarted, "memory back to" not told yet
    _suspected: set[str] = field(default_factory=set)  # findings whose suspect was told
    _last_status: float = 0.0

    @property
    def restarts_untold(self) -> bool:
        """A restart under way, or done with its server not yet seen back with its memory."""
        return bool(self._before)

    def poll(self, now: float) -> list[Line]:
        new: list[Line] = []
        self._events(new)
        self._suspects(new, now)
        self._plan(new, now)
        self._instances(new, now)
        self.lines.extend(new)
        return new

    def _events(self, new: list[Line]) -> None:
        events = self.get("/api/v1/events", after_id=self._after_id, limit=1000).get("events") or []
        for event in events:
            if not isinstance(event, dict):
                continue
            self._after_id = max(self._after_id, int(_number(event.get("id")) or 0))
            name = event.get("instance") if isinstance(event.get("instance"), str) else None
            kind = _text(event.get("kind"))
            data = _fields(event.get("data"))
            self._track_restart(kind, name, data)
            if kind in ("instance_down", "instance_exited") and name in self._before:
                continue  # the process medic is restarting went away: expected, not news
            text = describe_event(event)
            if text:
                ts = _number(event.get("ts")) or time.time()
                new.append(Line(ts, kind, text, name))

    def _suspects(self, new: list[Line], now: float) -> None:
        """Once per memory finding, what grows: suspects come a little after the finding opens
        (the allocation sites are traced from then on)."""
        for kind in ("leak", "oom-risk"):
            findings = self.get("/api/v1/findings", kind=kind).get("findings")
            for finding in findings if isinstance(findings, list) else []:
                key = _text(finding.get("id")) if isinstance(finding, dict) else ""
                text = describe_suspect(finding) if key and key not in self._suspected else None
                if text:
                    self._suspected.add(key)
                    new.append(Line(now, "suspect", text, _text(finding.get("instance")) or None))

    def _track_restart(self, kind: str, name: str | None, data: dict[str, object]) -> None:
        """The pids come from the events themselves: the instance list may show the new process
        before the narrator reads the event that started its restart."""
        if name is None:
            return
        if kind == "remediation_restart_started":
            old_pid = data.get("old_pid")
            pid = old_pid if isinstance(old_pid, int) else self.pids.get(name)
            self._before[name] = (pid, self._rss.get(name) if pid == self.pids.get(name) else None)
            self._planned.pop(name, None)  # the next plan for it is news again
        elif kind == "remediation_restart_succeeded" and name in self._before:
            self._succeeded.add(name)
        elif kind.startswith("remediation_restart_"):
            self._before.pop(name, None)

    def _plan(self, new: list[Line], now: float) -> None:
        step = self.get("/api/v1/plan").get("step") or {}
        plan = step.get("plan") if isinstance(step, dict) else None
        entries = plan.get("entries") if isinstance(plan, dict) else None
        for entry in entries or []:
            if not isinstance(entry, dict):
                continue
            key = _text(entry.get("instance"))
            slot = _number(entry.get("slot_at"))
            told = self._planned.get(key)
            if slot is not None and told is not None and abs(slot - told) <= PLAN_MOVED:
                continue
            text = describe_plan_entry(entry)
            if text:
                self._planned[key] = slot if slot is not None else float("nan")
                new.append(Line(now, "restart_planned", text, key))

    def _instances(self, new: list[Line], now: float) -> None:
        instances = self.get("/api/v1/instances").get("instances") or []
        for inst in instances:
            if not isinstance(inst, dict) or not isinstance(inst.get("name"), str):
                continue
            name, pid, rss = inst["name"], inst.get("pid"), _number(inst.get("rss_bytes"))
            before = self._before.get(name)
            if name in self._succeeded and before and isinstance(pid, int) and pid != before[0] and rss:
                del self._before[name]
                self._succeeded.discard(name)
                text = f"{name} is back (pid {pid}): memory {format_bytes(rss)}"
                text += f", was {format_bytes(before[1])} before the restart" if before[1] else ""
                new.append(Line(now, "memory_back", text, name))
            if isinstance(pid, int):
                self.pids[name] = pid
            if rss is not None and name not in self._before:
                self._rss[name] = rss
        if self.status_every and now - self._last_status >= self.status_every:
            status = status_line(instances)
            if status:
                self._last_status = now
                new.append(Line(now, "status", status))
