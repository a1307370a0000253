"""Python suspects on stored snapshots (`agent.detect.explain.pysuspects`): containers judged as suspects, a
site held by the container its newest entries sit in, a type by the growing container that holds it,
the line that adds to a container, the tracing session of one process and one session only; what a
leak finding waits for (`collecting`), the detection job's request for sites while a leak the type
view cannot explain is pending; the hook's replies made into snapshots whatever they hold; and the
lines `medic leaks` says about them."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.cli.leaks import notes
from agent.core.histograms import HistogramRow, Snapshot
from agent.core.records import Event, ProbeTarget
from agent.detect import DetectParams
from agent.detect.explain.pysuspects import collecting, snapshots_needed, unexplained
from agent.detect.explain.ranking import suspects_for
from agent.detect.explain.suspects import current_lifetime
from agent.detect.model import Finding
from agent.detect.slow.detector import SlowParams
from agent.jobs.detection import Detection
from agent.state.eventlog import EventLog
from agent.state.histograms import HistogramStore
from agent.state.store import Store
from agent.watch.tracker import Tracker
from probes.pysnapshots import containers_snapshot_from_reply, sites_snapshot_from_reply

T0 = 1_800_000_000.0
APP = "/srv/app/cache_service.py"


def snapshot(source: str, i: int, rows: list[HistogramRow], **meta) -> Snapshot:
    return Snapshot(
        "svc",
        source,
        T0 + 10 * i,
        rows,
        sum(r.count for r in rows),
        sum(r.bytes for r in rows),
        7,
        100.0,
        len(rows),
        meta,
    )


def store_with_a_cache_leak(tmp_path, snapshots: int = 10, session: float = T0) -> Store:
    """A Python service whose module-level dict of int -> bytes grows by 100 entries of 16 KiB every
    10 s, beside a bounded LRU; the sites session names the line that fills it and what holds it."""
    store = Store(tmp_path)
    histos = HistogramStore(store)
    holders = [
        {
            "name": "cache_service.CACHE",
            "type": "dict",
            "len": 1000,
            "holds": "int -> bytes",
            "sites": [f"{APP}:12"],
            "added_at": f"{APP}:16",
            "traceback": [f"{APP}:16"],
            "by": "table",
        },
        {
            "name": "cache_service.RECENT",
            "type": "OrderedDict",
            "sites": [f"{APP}:12"],
            "added_at": f"{APP}:20",
        },
    ]
    for i in range(snapshots):
        n = 100 * (i + 1)
        cache = {"name": "cache_service.CACHE", "type": "dict", "len": n, "kinds": ["int -> bytes"]}
        recent = {"name": "cache_service.RECENT", "type": "OrderedDict", "len": 64, "kinds": ["int -> bytes"]}
        histos.add(
            snapshot(
                "python",
                i,
                [
                    HistogramRow("bytes", n + 64, 16_400.0 * (n + 64)),
                    HistogramRow("dict", 900 + i % 3, 90_000),
                ],
                containers=[cache, recent],
            )
        )
        histos.add(
            snapshot(
                "containers",
                i,
                [
                    HistogramRow("cache_service.CACHE", n, 16_400.0 * n + 36 * n, "dict int -> bytes"),
                    HistogramRow("cache_service.RECENT", 64, 64 * 16_400.0, "OrderedDict int -> bytes"),
                ],
            )
        )
        histos.add(
            snapshot(
                "tracemalloc",
                i,
                [
                    HistogramRow(f"{APP}:12", n, 16_400.0 * n, f"{APP}:12 ← {APP}:16"),
                    HistogramRow(f"{APP}:30", 50 + i % 2, 5000.0 + 100 * (i % 2)),
                ],
                started_at=session,
                holders=holders,
            )
        )
    return store


def test_a_site_is_held_by_its_growing_container_and_builtins_follow(tmp_path):
    store = store_with_a_cache_leak(tmp_path)
    found = suspects_for(store, "svc", T0 - 60, T0 + 600)
    kinds = [(s.kind, s.name) for s in found]
    assert kinds[0] == ("site", f"{APP}:12"), kinds
    site = found[0]
    assert site.held_by and site.held_by[0]["name"] == "cache_service.CACHE"
    assert site.held_by[0]["added_at"] == f"{APP}:16" and site.held_by[0]["bytes_per_second"] > 100_000
    assert ("container", "cache_service.CACHE") not in kinds  # shown beside its site, not again
    assert kinds[-1] == ("type", "bytes") and found[-1].held_by[0]["name"] == "cache_service.CACHE"
    assert not [s for s in found if "RECENT" in s.name or "RECENT" in str(s.held_by)]  # bounded: flat
    json.dumps([s.to_dict() for s in found], allow_nan=False)


def test_the_container_is_a_suspect_of_its_own_with_the_line_that_fills_it(tmp_path):
    store = store_with_a_cache_leak(tmp_path)
    found = suspects_for(store, "svc", T0 - 60, T0 + 600, kinds=("type", "container"))
    first = found[0]
    assert (first.kind, first.name, first.detail) == ("container", "cache_service.CACHE", "dict int -> bytes")
    assert first.added_at == f"{APP}:16"  # from the holders of the latest sites snapshot
    assert first.count_per_second == 10.0 and first.to_dict()["added_at"] == f"{APP}:16"


def test_a_new_tracing_session_counts_from_its_own_start():
    first = [snapshot("tracemalloc", i, [], started_at=T0) for i in range(5)]
    second = [snapshot("tracemalloc", 5 + i, [], started_at=T0 + 55) for i in range(3)]
    assert current_lifetime(first + second) == second
    assert snapshots_needed(50) == 8 and snapshots_needed(1) == 4


def test_collecting_says_how_far_a_session_is_and_when_it_stopped(tmp_path):
    store = store_with_a_cache_leak(tmp_path, snapshots=3)
    waiting = collecting(store, "svc", T0 - 60, T0 + 25, [], requested=True)
    needed = snapshots_needed(2)  # two sites compared
    assert waiting["state"] == "tracing" and waiting["snapshots"] == 3 and waiting["needed"] == needed == 5
    assert waiting["expected_at"] == T0 + 20 + (needed - 3) * 10 and waiting["interval_s"] == 10
    store.add_event(
        Event(
            "sites_stopped",
            "allocation-site tracing in svc ended: tracemalloc used 17 MB, over the memory budget",
            "svc",
            data={"reason": "over the memory budget", "setting": "histograms.python.sites.max_memory"},
            ts=T0 + 27,
        )
    )
    stopped = collecting(store, "svc", T0 - 60, T0 + 30, [], requested=True)
    assert stopped["state"] == "stopped" and stopped["expected_at"] is None
    assert stopped["stopped"]["setting"] == "histograms.python.sites.max_memory"
    assert "memory budget" in stopped["message"]
    assert collecting(store, "svc", T0 - 60, T0 + 30, [{"kind": "site"}], requested=True) is None
    assert collecting(store, "jvm", T0 - 60, T0 + 30, [], requested=True) is None  # no Python hook


def test_the_type_view_explains_a_leak_only_with_a_holder_or_half_the_growth():
    assert unexplained([])
    assert unexplained([{"kind": "type", "name": "bytes", "share": 0.2}])
    assert not unexplained([{"kind": "type", "name": "app.Record", "share": 0.7}])
    assert not unexplained([{"kind": "container", "name": "app.CACHE", "share": None}])


def test_a_pending_leak_the_type_view_cannot_explain_asks_for_sites_once(tmp_path):
    store = Store(tmp_path)
    histos = HistogramStore(store)
    for i in range(6):
        for instance in ("svc", "held"):
            found = snapshot("python", i, [HistogramRow("dict", 900 + i % 2, 90_000)])
            found.instance = instance
            histos.add(found)
    events = EventLog(store)
    asked: list[Event] = []
    events.subscribe(lambda e: asked.append(e) if e.kind == "sites_requested" else None)
    detection = Detection(Tracker([], store, events), store, events, DetectParams(), SlowParams())

    def pending(instance: str) -> Finding:
        return Finding(
            f"{instance}:leak:1",
            instance,
            "leak",
            "warning",
            "pending",
            T0,
            None,
            T0 + 60,
            None,
            f"{instance} leaks",
            "leak",
            {},
            100.0,
        )

    said = detection._collecting("svc", [pending("svc")], T0 - 60, T0 + 60, {"suspects": []})
    assert said is not None and said["state"] == "requested", said
    assert [e.instance for e in asked] == ["svc"]
    detection._collecting("svc", [pending("svc")], T0 - 60, T0 + 70, {"suspects": []})
    assert len(asked) == 1  # once per process lifetime
    explained = {"suspects": [{"kind": "container", "name": "app.CACHE", "share": None}]}
    assert detection._collecting("held", [pending("held")], T0 - 60, T0 + 60, explained) is None
    assert len(asked) == 1  # the type view names a holder: sites wait for the finding to open


def test_medic_leaks_says_what_holds_a_suspect_and_what_a_finding_waits_for():
    finding = {
        "instance": "svc",
        "kind": "leak",
        "evidence": {
            "suspects": [
                {
                    "name": f"{APP}:12",
                    "kind": "site",
                    "held_by": [
                        {
                            "where": "cache_service.CACHE",
                            "what": "dict int -> bytes",
                            "added_at": f"{APP}:16",
                        }
                    ],
                },
                {
                    "name": "cache_service.NAMES",
                    "kind": "container",
                    "detail": "list str",
                    "added_at": f"{APP}:22",
                },
            ],
            "collecting": {
                "what": "allocation sites (tracemalloc)",
                "state": "tracing",
                "message": "3 of the 8 snapshots a site suspect needs",
                "expected_at": T0 + 300,
            },
        },
    }
    said = notes(finding, T0)
    assert (
        said[0] == f"svc leak: {APP}:12 is held by cache_service.CACHE (dict int -> bytes), added at {APP}:16"
    )
    assert said[1] == f"svc leak: cache_service.NAMES (list str) is filled at {APP}:22"
    assert said[2].endswith("3 of the 8 snapshots a site suspect needs; a suspect is expected in 5m")


# --------------------------------------------------------------------------- the hook's replies
wide = st.integers(-(10**400), 10**400) | st.integers(2**63 - 2, 2**63 + 2)
figures = st.one_of(st.integers(-5, 10**9), wide, st.floats(), st.none(), st.text(max_size=3), st.booleans())
texts = st.one_of(st.text(max_size=400), st.none(), st.integers(), st.lists(st.text(max_size=5), max_size=3))
containers = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {},
            optional={
                "name": texts,
                "type": texts,
                "len": figures,
                "bytes": figures,
                "content_bytes": figures,
                "holds": texts,
                "kinds": st.one_of(st.lists(texts, max_size=6), texts),
                "complete": st.one_of(st.booleans(), st.none(), st.text(max_size=2)),
                "sampled": figures,
            },
        ),
        st.integers(),
        st.text(max_size=4),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(items=containers, complete=st.one_of(st.booleans(), st.none()))
def test_any_containers_reply_makes_a_sane_snapshot(items, complete):
    made = containers_snapshot_from_reply(
        ProbeTarget("py0", 1, 1.0), 100.0, {"containers": items, "contents_complete": complete}
    )
    if made is None:
        return
    assert made.kind == "container" and made.rows
    assert len({r.name for r in made.rows}) == len(made.rows) <= 32
    assert all(math.isfinite(x) and x >= 0 for r in made.rows for x in (r.count, r.bytes))
    assert all(len(r.name) <= 300 for r in made.rows)
    json.dumps(made.to_dict(), allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    holders=st.one_of(
        st.lists(
            st.one_of(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "name": texts,
                        "sites": st.one_of(st.lists(texts, max_size=8), texts),
                        "added_at": texts,
                        "traceback": st.one_of(st.lists(texts, max_size=30), texts),
                        "len": figures,
                        "by": texts,
                    },
                ),
                st.integers(),
            ),
            max_size=30,
        ),
        texts,
    ),
    started=figures,
)
def test_any_holders_in_a_sites_reply_are_kept_sane(holders, started):
    made = sites_snapshot_from_reply(
        ProbeTarget("py0", 1, 1.0), 100.0, {"holders": holders, "started_at": started}
    )
    kept = made.meta["holders"]
    assert len(kept) <= 16
    for holder in kept:
        assert holder["name"] is None or (isinstance(holder["name"], str) and len(holder["name"]) <= 300)
        assert all(isinstance(s, str) for s in holder["sites"]) and len(holder["sites"]) <= 4
        assert holder["by"] in ("table", "entry", None)
    json.dumps(made.to_dict(), allow_nan=False)
