"""The demo's closing report: per server what medic found and did, from the agent's API, as a
table for people or one JSON document (`medic demo --json`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent.core.text import render as render_table
from agent.core.units import format_bytes
from agent.demo.config import DemoSettings, ServerSpec
from agent.demo.narrate import ApiGet, Line, top_suspect

if TYPE_CHECKING:
    from agent.demo.load import TargetStats  # a type only: agent.demo.load brings numpy along


def collect(
    get: ApiGet,
    settings: DemoSettings,
    servers: list[ServerSpec],
    lines: list[Line],
    load: Mapping[str, TargetStats],
    started: float,
    ended: float,
) -> dict[str, Any]:
    """Everything the report shows, as plain data; `get(path, **params)` asks the agent's API."""
    findings = get("/api/v1/findings", state="all", limit=10_000).get("findings") or []
    actions = get("/api/v1/actions", limit=10_000).get("actions") or []
    instances = {i.get("name"): i for i in get("/api/v1/instances").get("instances") or []}
    rows = []
    for server in servers:
        mine = [a for a in actions if a.get("instance") == server.name and a.get("action") == "restart"]
        inst = instances.get(server.name) or {}
        stats = load.get(server.name)
        rows.append(
            {
                "name": server.name,
                "behaviour": server.behaviour,
                "port": server.port,
                "findings": sorted({f.get("kind") for f in findings if f.get("instance") == server.name}),
                "restarts_by_medic": sum(1 for a in mine if a.get("outcome") == "succeeded"),
                "restarts": inst.get("restarts", 0),
                "rss_bytes": inst.get("rss_bytes"),
                "requests_ok": getattr(stats, "ok", 0),
                "requests_failed": getattr(stats, "errors", 0),
            }
        )
    return {
        "started_at": started,
        "duration_seconds": round(ended - started, 1),
        "settings": {
            "rps": settings.rps,
            "batch": settings.batch,
            "leak_rate_bytes_per_second": settings.actual_leak_rate,
            "memory_limit_bytes": settings.memory_limit,
            "slo_p99_seconds": settings.slo,
        },
        "servers": rows,
        "findings": [
            {
                **{
                    k: f.get(k)
                    for k in ("id", "instance", "kind", "state", "severity", "opened_at", "summary")
                },
                "suspect": (top_suspect(f) or {}).get("name"),
            }
            for f in findings
        ],
        "actions": [
            {
                k: a.get(k)
                for k in (
                    "instance",
                    "action",
                    "request_kind",
                    "outcome",
                    "started_at",
                    "finished_at",
                    "reason",
                )
            }
            for a in actions
        ],
        "timeline": [line.to_dict() for line in lines],
    }


def render(report: dict[str, Any]) -> str:
    """The per-server table people read at the end of a demo."""
    rows = [
        [
            s["name"],
            s["behaviour"],
            ", ".join(s["findings"]) or "-",
            str(s["restarts_by_medic"]),
            format_bytes(s["rss_bytes"]) if s["rss_bytes"] is not None else "-",
            f"{s['requests_ok']}/{s['requests_ok'] + s['requests_failed']}",
        ]
        for s in report["servers"]
    ]
    header = ["SERVER", "BEHAVIOUR", "FINDINGS", "RESTARTED", "RSS NOW", "REQUESTS OK"]
    return render_table(header, rows, numeric={3})
