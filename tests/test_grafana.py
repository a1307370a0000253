"""`dashboards/grafana/medic.json`: valid JSON, a datasource variable used everywhere, a sane layout,
and only metrics medic exports."""

from __future__ import annotations

import json

from support.notify import exported_metric_names, metric_names_in
from support.procs import REPO

DASHBOARD = REPO / "dashboards" / "grafana" / "medic.json"


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dash: dict) -> list[dict]:
    return [p for p in dash["panels"] if p["type"] != "row"]


def test_valid_json_with_variables():
    dash = load()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for name in ("job", "fleet", "name"):
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert variables[name]["includeAll"] and variables[name]["multi"]
    assert variables["slo"]["type"] == "textbox" and variables["projection"]["type"] == "custom"
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 30


def test_every_query_uses_the_datasource_variable():
    dash = load()
    for panel in panels(dash):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["expr"].strip(), panel["title"]
    for annotation in dash["annotations"]["list"]:
        if annotation.get("expr"):
            assert annotation["datasource"]["uid"] == "${datasource}"


def test_layout_ids_unique_and_no_overlaps():
    dash = load()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for panel in dash["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area


def test_covers_what_on_call_needs():
    titles = " | ".join(p["title"] for p in load()["panels"])
    for needed in (
        "Fleet overview",
        "Memory, limit and projection",
        "p99 latency vs SLO",
        "Restarts timeline",
    ):
        assert needed in titles


def test_every_metric_exists(tmp_path):
    dash = load()
    exprs = [t["expr"] for p in panels(dash) for t in p["targets"]]
    exprs += [a.get("expr", "") for a in dash["annotations"]["list"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v.get("definition")]
    used = set().union(*(metric_names_in(e) for e in exprs))
    known = exported_metric_names(tmp_path) | {"up"}
    assert used - known == set(), f"not exported by medic: {sorted(used - known)}"
    assert {
        "medic_instance_info",
        "medic_latency_seconds",
        "medic_requests_total",
        "process_resident_memory_bytes",
    } <= used
