"""Blockers: conditions under which no restart may start, each returning a Decision with its reason.

MinUptime         the instance started less than `min_uptime` ago
CapacityFloor     too many of the fleet's other instances are not ready or restarting
PrometheusAlerts  a configured alert is firing (Prometheus `/api/v1/alerts`); an unreachable
                  Prometheus blocks too: a blocker that cannot be checked holds
TimeWindowGate    outside the allowed restart windows (the engine's first stage)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.core.bounded import bounded_request
from agent.core.patterns import compile_pattern
from remediation.model import Decision, FleetEntry, InstanceView, RestartRecord
from remediation.text import at, span
from remediation.windows import Windows

STAGE = "blocker"
MAX_ANSWER_BYTES = 16 * 2**20  # /api/v1/alerts of a large Prometheus; more is not its answer


@dataclass(frozen=True, slots=True)
class BlockerContext:
    view: InstanceView
    now: float
    fleet: Sequence[FleetEntry] = ()  # every agent's published entries
    in_flight: Sequence[RestartRecord] = field(default_factory=tuple)


class Blocker(Protocol):
    name: str

    def check(self, ctx: BlockerContext) -> Decision: ...


class MinUptime:
    name = "min-uptime"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def check(self, ctx: BlockerContext) -> Decision:
        uptime = ctx.view.uptime(ctx.now)
        if uptime is None:
            return Decision.block(STAGE, self.name, f"{ctx.view.name} has no running process")
        if uptime < self.seconds:
            return Decision.block(
                STAGE,
                self.name,
                f"{ctx.view.name} started {span(uptime)} ago; min_uptime is {span(self.seconds)}",
                (ctx.view.start_time or ctx.now) + self.seconds,
            )
        return Decision.allow(STAGE, f"up for {span(uptime)}")


class CapacityFloor:
    name = "capacity"

    def __init__(self, max_unavailable: int = 1, min_ready_fraction: float | None = None) -> None:
        self.max_unavailable = max_unavailable
        self.min_ready_fraction = min_ready_fraction

    def check(self, ctx: BlockerContext) -> Decision:
        fleet = ctx.view.fleet
        peers = {e.instance: e for e in ctx.fleet if e.fleet == fleet and e.instance != ctx.view.name}
        restarting = {r.instance for r in ctx.in_flight if r.fleet == fleet and r.instance != ctx.view.name}
        down = sorted({name for name, e in peers.items() if not e.ready} | restarting)
        total = len(peers | {ctx.view.name: None}) if peers else 1
        unavailable = len(down) + 1  # the one we would restart
        if unavailable > self.max_unavailable:
            return Decision.block(
                STAGE,
                self.name,
                f"fleet {fleet}: {', '.join(down)} not ready or restarting; restarting {ctx.view.name} too "
                f"would make {unavailable} unavailable (max_unavailable {self.max_unavailable})",
                unavailable=down,
            )
        if self.min_ready_fraction is not None and (total - unavailable) / total < self.min_ready_fraction:
            return Decision.block(
                STAGE,
                self.name,
                f"fleet {fleet}: only {total - unavailable} of {total} would stay ready during the restart "
                f"(min_ready_fraction {self.min_ready_fraction:g})",
                unavailable=down,
            )
        return Decision.allow(STAGE, f"fleet {fleet}: {total - unavailable} of {total} stay ready")


def parse_alerts(payload: Any) -> list[dict[str, Any]]:
    """Alerts of a Prometheus `/api/v1/alerts` answer: [{"name", "state", "labels"}]; ValueError if malformed."""
    if not isinstance(payload, dict):
        raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
    if payload.get("status") != "success":
        raise ValueError(f"status is {payload.get('status')!r}: {payload.get('error', 'no error given')}")
    data = payload.get("data")
    alerts = data.get("alerts") if isinstance(data, dict) else None
    if not isinstance(alerts, list):
        raise ValueError("no data.alerts list in the answer")
    out = []
    for alert in alerts:
        if not isinstance(alert, dict) or not isinstance(alert.get("labels"), dict):
            raise ValueError(f"an alert without labels: {str(alert)[:100]}")
        labels = {str(k): str(v) for k, v in alert["labels"].items()}
        out.append(
            {"name": labels.get("alertname", ""), "state": str(alert.get("state", "")), "labels": labels}
        )
    return out


class PrometheusAlerts:
    name = "prometheus-alerts"

    def __init__(self, url: str, match: Sequence[str] = (), ignore: Sequence[str] = (), timeout: float = 5.0):
        self.url = url.rstrip("/") + "/api/v1/alerts"
        self.match = [compile_pattern(p) for p in match]  # alert names are others' text: linear time
        self.ignore = [compile_pattern(p) for p in ignore]
        self.timeout = timeout

    def _blocks(self, name: str) -> bool:
        if any(p.search(name) for p in self.ignore):
            return False
        return not self.match or any(p.search(name) for p in self.match)

    def check(self, ctx: BlockerContext) -> Decision:
        import httpx  # loaded by the first alert blocker: an agent without one does not carry it

        try:
            response = bounded_request(
                httpx, "GET", self.url, max_bytes=MAX_ANSWER_BYTES, seconds=3 * self.timeout,
                timeout=self.timeout, trust_env=False,
            )  # fmt: skip
            alerts = parse_alerts(response.json())
        except httpx.TimeoutException:
            return Decision.block(
                STAGE, self.name, f"Prometheus {self.url} did not answer within {self.timeout:g}s; holding"
            )
        except httpx.HTTPError as exc:
            return Decision.block(STAGE, self.name, f"cannot query Prometheus {self.url} ({exc}); holding")
        except ValueError as exc:
            return Decision.block(
                STAGE, self.name, f"Prometheus {self.url} answered something unexpected: {exc}; holding"
            )
        firing = sorted({a["name"] for a in alerts if a["state"] == "firing" and self._blocks(a["name"])})
        if firing:
            return Decision.block(STAGE, self.name, f"alerts firing: {', '.join(firing)}", alerts=firing)
        return Decision.allow(STAGE, "no blocking alert firing")


class TimeWindowGate:
    name = "window"

    def __init__(self, windows: Windows) -> None:
        self.windows = windows

    def check(self, ctx: BlockerContext) -> Decision:
        if self.windows.contains(ctx.now):
            return Decision.allow("window", "inside a restart window")
        opens = self.windows.next_open(ctx.now)
        return Decision.block(
            "window",
            "outside-window",
            f"outside the restart windows ({self.windows.describe()}); next opens {at(opens)}",
            opens,
        )
