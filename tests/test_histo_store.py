"""Histogram snapshots in the store (compaction, queries, retention, from the collector), their diffs, the
`/api/v1/instances/{name}/histograms…` routes of the real app, and the tables `medic histo` prints."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.api.histograms import histogram_routes
from agent.cli.heap import render_attribution
from agent.cli.histo import render_diff, render_snapshot, render_suspects
from agent.config.loader import validate_config
from agent.core.errors import StoreError
from agent.core.histograms import HistogramRow, Snapshot, compact
from agent.core.records import ProbeResult, ProbeTarget, Sample
from agent.detect.explain.histodiff import diff, same_process
from agent.state.eventlog import EventLog
from agent.state.histograms import HistogramStore
from agent.state.store import Store
from agent.watch.tracker import Tracker
from support.collector import one_instance_collector


def snapshot(ts: float, rows: dict[str, tuple[float, float]], pid: int = 7, source: str = "jvm") -> Snapshot:
    made = [
        HistogramRow(n, c, b, "java.base@17" if n.startswith("[") else None) for n, (c, b) in rows.items()
    ]
    total_c = sum(c for c, _ in rows.values())
    total_b = sum(b for _, b in rows.values())
    return Snapshot("svc", source, ts, made, total_c, total_b, pid, 100.0 + pid, len(made))


def test_compaction_keeps_the_top_by_bytes_and_by_count():
    rows = {f"c{i}": (float(i), float(1000 - i)) for i in range(1000)}  # bytes fall as counts rise
    kept = compact(snapshot(1.0, rows), top=10)
    names = {r.name for r in kept.rows}
    assert {f"c{i}" for i in range(10)} <= names and {f"c{i}" for i in range(990, 1000)} <= names
    assert len(names) == 20 and kept.rows_total == 1000 and kept.trimmed
    assert kept.total_bytes == sum(b for _, b in rows.values())


def test_snapshots_round_trip_and_expire(tmp_path):
    store = Store(tmp_path)
    histos = HistogramStore(store, top=3, retention=100.0)
    first = histos.add(snapshot(1000.0, {"a": (1, 10), "b": (2, 20), "c": (3, 30), "d": (4, 40)}))
    histos.add(snapshot(1050.0, {"a": (2, 20)}))
    histos.add(snapshot(1060.0, {"n": (1, 1)}, source="nmt"))
    loaded = histos.load(first)
    assert loaded is not None and loaded.kind == "class" and loaded.rows_total == 4
    assert sorted(r.name for r in loaded.rows) == ["b", "c", "d"]  # top 3 by bytes and by count
    assert histos.nearest("svc", "class", 1049.0).id == first
    assert histos.nearest("svc", "class", 10.0).id == first  # nothing before: the first after
    assert histos.nearest("svc", "type", 1049.0) is None
    assert [s.ts for s in histos.history("svc", "class", 0, 2000)] == [1000.0, 1050.0]
    assert [s.kind for s in histos.snapshots("svc", 0, 2000)] == ["class", "class", "nmt"]
    histos.add(snapshot(1200.0, {"a": (3, 30)}))  # 1000 is now older than the retention
    assert [s.ts for s in histos.history("svc", "class", 0, 2000)] == [1200.0]
    assert store.query("SELECT count(*) FROM histo_rows WHERE snapshot_id = ?", (first,)) == [(0,)]
    assert store.query("SELECT count(*) FROM histo_names")[0][0] == 5  # names are interned once


class SnapshotProbe:
    """A probe whose every run returns one sample and one snapshot."""

    name = "histo"
    schedule = "slow"

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        return ProbeResult(
            [Sample(target.instance, "up", now, 1.0)], snapshots=[snapshot(now, {"a": (1, 1)})]
        )

    def forget(self, target: ProbeTarget) -> None:
        pass


class BrokenHistograms(HistogramStore):
    def add(self, snapshot: Snapshot) -> int:
        raise StoreError("disk full")


def test_the_collector_stores_the_snapshots_probes_return(tmp_path):
    store = Store(tmp_path)
    collector = one_instance_collector(store, [SnapshotProbe()])
    assert collector.run("slow", now=1.0) == 1
    collector.run("slow", now=2.0)
    assert [s.ts for s in HistogramStore(store).history("svc", "class", 0, 10)] == [1.0, 2.0]


def test_a_snapshot_that_cannot_be_stored_is_a_partial_failure(tmp_path):
    store = Store(tmp_path)
    collector = one_instance_collector(store, [SnapshotProbe()], BrokenHistograms(store))
    assert collector.run("slow", now=1.0) == 1  # the samples are kept
    health = collector.tracker.states["svc"].probes["histo"]
    assert not health.ok and health.last_error == "disk full"
    failed = [e for e in store.events(instance="svc") if e.kind == "probe_error"]
    assert failed and failed[0].data["partial"] is True


def test_diff_marks_rows_only_one_side_kept():
    before = snapshot(0.0, {"a": (1, 100), "b": (5, 500)})
    after = snapshot(60.0, {"a": (3, 300), "c": (1, 50)})
    after.rows_total = 10  # trimmed: names missing here may be below its cutoff
    result = diff(before, after)
    rows = {r.name: r for r in result.rows}
    assert [r.name for r in result.rows] == ["a", "c", "b"]
    assert rows["a"].delta_bytes == 200 and not rows["a"].approximate
    assert rows["b"].delta_bytes == -500 and rows["b"].approximate
    assert result.to_dict()["rows"][0]["bytes_per_second"] == pytest.approx(200 / 60)
    assert result.to_dict()["same_process"]
    assert not same_process(before, snapshot(1.0, {}, pid=8))


@settings(max_examples=200, deadline=None)
@given(
    a=st.dictionaries(st.text(max_size=8), st.tuples(st.floats(0, 1e9), st.floats(0, 1e12)), max_size=20),
    b=st.dictionaries(st.text(max_size=8), st.tuples(st.floats(0, 1e9), st.floats(0, 1e12)), max_size=20),
)
def test_diff_accounts_for_every_name(a, b):
    result = diff(snapshot(0.0, a), snapshot(1.0, b))
    assert {r.name for r in result.rows} == set(a) | set(b)
    assert sum(r.delta_bytes for r in result.rows) == pytest.approx(
        sum(v for _, v in b.values()) - sum(v for _, v in a.values()), rel=1e-6, abs=1e-3
    )


# ------------------------------------------------------------------------------------------ the API
@pytest.fixture
def api(tmp_path):
    """The histogram routes on their own app (the agent's full app is exercised by the end-to-end tests)."""
    store = Store(tmp_path)
    config = validate_config({"instances": [{"name": "svc", "match": {"pid": 1}}]})
    tracker = Tracker(config.instances, store, EventLog(store))
    app = FastAPI()
    app.include_router(histogram_routes(SimpleNamespace(store=store, tracker=tracker)))
    return Client(app), store


class Client:
    """GET against the app in-process (starlette's TestClient warns under pytest's warnings-as-errors)."""

    def __init__(self, app) -> None:
        self.app = app

    def get(self, path: str, params: dict | None = None) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://medic") as client:
                return await client.get(path, params=params)

        return asyncio.run(go())


def test_histogram_routes(api):
    client, store = api
    assert client.get("/api/v1/instances/nope/histograms").status_code == 404
    # no data yet is an answer, not an error: a kind the instance's process has (pid 1 is no JVM)
    missing = client.get("/api/v1/instances/svc/histograms/diff")
    assert missing.status_code == 200 and missing.json()["kind"] == "type" and missing.json()["rows"] == []
    assert missing.json()["pending"].startswith("no type histograms of svc yet: Python targets need")
    assert "JVM" not in missing.json()["pending"]
    classes = client.get("/api/v1/instances/svc/histograms/diff", params={"kind": "class"}).json()
    assert "JVM targets" in classes["pending"]
    now = time.time()
    histos = HistogramStore(store)
    histos.add(snapshot(now - 300, {"app.Leak": (100, 4800), "[B": (10, 1000)}))
    only_one = client.get("/api/v1/instances/svc/histograms/diff")  # the kind of its newest snapshot
    assert only_one.status_code == 200 and only_one.json()["kind"] == "class"
    assert only_one.json()["pending"].startswith("only one class snapshot of svc so far: the next comes")
    for i in range(1, 6):
        histos.add(
            snapshot(now - 300 + 60 * i, {"app.Leak": (100 + 50 * i, 4800 + 2400 * i), "[B": (10, 1000)})
        )
    listing = client.get("/api/v1/instances/svc/histograms", params={"top": 1}).json()
    assert len(listing["snapshots"]) == 6 and listing["latest"]["class"]["rows"][0]["name"] == "app.Leak"

    body = client.get("/api/v1/instances/svc/histograms/diff", params={"from": "1h", "top": 5}).json()
    assert body["seconds"] == pytest.approx(300) and body["rows"][0]["name"] == "app.Leak"
    assert body["rows"][0]["delta_count"] == 250
    by_id = client.get(
        "/api/v1/instances/svc/histograms/diff",
        params={"from_id": body["before"]["id"], "to_id": body["before"]["id"] + 1},
    ).json()
    assert by_id["seconds"] == pytest.approx(60)
    assert client.get("/api/v1/instances/svc/histograms/diff", params={"from_id": 999}).status_code == 404
    assert client.get("/api/v1/instances/svc/histograms/diff", params={"kind": "bogus"}).status_code == 422
    assert "no site histograms" in client.get("/api/v1/instances/svc/heap/diff").json()["pending"]

    suspects = client.get("/api/v1/instances/svc/suspects", params={"since": "1h"}).json()["suspects"]
    assert [s["name"] for s in suspects] == ["app.Leak"]
    store.add_samples([Sample("svc", "rss_bytes", now - 60 * k, 1e8 + k) for k in range(10)])
    store.flush()
    layers = client.get("/api/v1/instances/svc/attribution", params={"since": "1h"}).json()
    assert layers["instance"] == "svc" and layers["rss_bytes"] is not None

    assert "app.Leak" in render_diff(body).splitlines()[2]
    assert "app.Leak" in render_suspects(suspects)
    assert "COUNT" in render_snapshot(listing["latest"]["class"])
    assert "memory layers of svc" in render_attribution(layers)
    assert "none grows steadily" in render_suspects([])
