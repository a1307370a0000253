"""The router: which events reach which sinks, with which dedup keys, and the alert state behind them."""

from __future__ import annotations

import pytest

from agent.config.loader import validate_config
from agent.notify.event_alerts import ALIASES, ROUTES, canonical
from agent.notify.outbox import Outbox
from agent.notify.router import Router
from agent.notify.silences import Silencer
from agent.notify.sinks import create_sinks
from agent.state.eventlog import EventLog
from agent.state.store import Store
from support.notify import active_alerts

T0 = 1_800_000_000.0


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("HOOK_SECRET", "0123456789abcdef0123")
    return lambda *sinks, **notify: World(tmp_path, list(sinks), notify)


class World:
    """A real store and event log, routed to real sinks (no network until something delivers)."""

    def __init__(self, tmp_path, sinks, notify):
        sinks = sinks or [
            {"type": "alertmanager", "url": "http://127.0.0.1:9"},
            {"type": "webhook", "url": "http://127.0.0.1:9/hook", "secret_env": "HOOK_SECRET"},
        ]
        self.config = validate_config({"notify": {"sinks": sinks, **notify}}).notify
        self.store = Store(tmp_path / "state")
        self.events = EventLog(self.store)
        self.sinks = create_sinks(self.config)
        self.outbox = Outbox(self.store, self.config.retry)
        self.silencer = Silencer(self.store, [], ["instance"])
        self.router = Router(
            self.config,
            self.store,
            self.outbox,
            self.sinks,
            labels_for=lambda name: {"fleet": "ranker", "zone": "b"} if name == "serving-7" else {},
            agent="ranker-7f9c",
            external_url="https://medic-ranker.example",
            silences=self.silencer,
            silence_for=600.0,
            repost_interval=60.0,
        )

    def finding(self, change, severity="warning", kind="leak", instance="serving-7", **extra):
        finding = {
            "id": f"{instance}:{kind}:1",
            "instance": instance,
            "kind": kind,
            "severity": severity,
            "summary": f"{instance} leaks 41 MB/h",
            "evidence": {"slope_bytes_per_second": 11400.0, "time_to_oom_seconds": 20400.0},
            **extra,
        }
        return self.events.emit(
            f"finding_{change}", f"finding {change}", instance=instance, severity=severity, finding=finding
        )

    def pump(self, now=T0):
        return self.router.pump(now)

    def items(self, sink=None):
        return sorted(self.outbox.items(sink=sink, limit=1000), key=lambda i: i.id)

    def close(self):
        for sink in self.sinks:
            sink.close()
        self.store.close()


def test_finding_opened_goes_to_every_sink_with_its_alert(world):
    w = world()
    event = w.finding("opened")
    assert w.pump() == 2
    am, hook = w.items("alertmanager"), w.items("webhook")
    assert [i.dedup_key for i in am] == ["alert:finding/serving-7/leak|warning"]
    assert [i.dedup_key for i in hook] == [f"event:{event.id}"]
    note = am[0].payload
    assert note["status"] == "firing" and note["alertname"] == "MedicLeak"
    assert note["instance"] == "serving-7" and note["fleet"] == "ranker" and note["kind"] == "leak"
    assert note["labels"] == {"fleet": "ranker", "zone": "b"}
    assert note["summary"] == "serving-7 leaks 41 MB/h"
    assert note["evidence"]["time_to_oom_seconds"] == 20400.0
    assert note["finding_id"] == "serving-7:leak:1"
    assert note["link"] == "https://medic-ranker.example/dashboard#instance=serving-7"
    assert note["agent"] == "ranker-7f9c"
    assert note["runbook"] == "https://medic.example.internal/docs/runbooks.md#medicleak"
    assert "`medic leaks serving-7`" in note["description"]
    assert active_alerts(w.router.store)[0]["sinks"] == ["alertmanager", "webhook"]
    w.close()


def test_severity_threshold_gates_findings_but_not_restarts(world):
    w = world()
    w.finding("opened", severity="info")
    w.events.emit("remediation_restart_succeeded", "restart succeeded", instance="serving-7", action_id=3)
    w.pump()
    assert [i.kind for i in w.items()] == ["restart_done"]  # info finding gated; the restart is not
    assert w.items("alertmanager") == []  # a restart is a message, not an alert
    w.close()


def test_resolve_goes_only_where_the_fire_went(world):
    w = world(
        {"type": "alertmanager", "url": "http://127.0.0.1:9"},
        {"type": "webhook", "name": "loud", "url": "http://127.0.0.1:9/a", "secret_env": "HOOK_SECRET"},
        {
            "type": "webhook",
            "name": "quiet",
            "url": "http://127.0.0.1:9/b",
            "secret_env": "HOOK_SECRET",
            "min_severity": "critical",
        },
    )
    w.finding("resolved")  # nothing fired: nothing to resolve
    w.pump()
    assert w.items() == []
    w.finding("opened")
    resolved = w.finding("resolved", summary="resolved: the process restarted")
    w.pump()
    assert [i.sink for i in w.items() if i.kind == "finding_resolved"] == ["alertmanager", "loud"]
    am = w.items("alertmanager")
    assert len(am) == 1 and am[0].payload["status"] == "resolved"  # the pending firing was replaced
    assert am[0].payload["ends_at"] == resolved.ts and am[0].revision == 1
    assert w.items("quiet") == []
    assert active_alerts(w.router.store) == []
    w.close()


def test_severity_change_ends_the_old_alert_and_fires_a_new_one(world):
    w = world()
    w.finding("opened", severity="warning")
    w.pump()
    first = w.items("alertmanager")[0]
    w.outbox.delivered(first, T0)
    w.finding("updated", severity="critical")
    w.pump(T0 + 10)
    pending = [i for i in w.items("alertmanager") if i.state == "pending"]
    assert [(i.dedup_key, i.payload["status"]) for i in pending] == [
        ("alert:finding/serving-7/leak|warning", "resolved"),
        ("alert:finding/serving-7/leak|critical", "firing"),
    ]
    assert pending[1].payload["starts_at"] == first.payload["starts_at"]  # the same problem, still going
    w.close()


def test_min_severity_reached_later_fires_then(world):
    w = world()
    w.finding("opened", severity="info")
    w.finding("updated", severity="error")
    w.pump()
    assert [(i.sink, i.kind) for i in w.items()] == [
        ("alertmanager", "finding_updated"),
        ("webhook", "finding_updated"),
    ]
    w.close()


def test_external_findings_are_not_posted_back_to_alertmanager(world):
    w = world()
    w.finding("opened", kind="external")
    w.pump()
    assert [i.sink for i in w.items()] == ["webhook"]
    assert w.items()[0].payload["alertname"] == "MedicExternal"
    w.close()


def test_restart_events_hold_and_release_silences(world):
    w = world()
    w.events.emit("remediation_restart_started", "restarting", instance="serving-7", action_id=12)
    w.pump()
    [(action, instance, until, state)] = w.store.query(
        "SELECT action_id, instance, until, state FROM notify_silence_requests"
    )
    started = w.store.events(kinds=["remediation_restart_started"])[0]
    assert (action, instance, state) == ("12", "serving-7", "active") and until == started.ts + 600.0
    w.events.emit(
        "remediation_restart_started", "restarting", instance="serving-7", action_id=13, until=started.ts + 60
    )
    w.events.emit(
        "remediation_restart_started", "restarting", instance="serving-7", action_id=14, until="soon"
    )
    w.pump()
    untils = dict(
        w.store.query("SELECT action_id, until FROM notify_silence_requests WHERE action_id != '12'")
    )
    assert untils["13"] == started.ts + 60  # the engine's expiry wins
    assert untils["14"] > started.ts + 599  # an unusable one falls back to silence_for
    failed_event = w.events.emit(
        "remediation_restart_failed",
        "restart failed: unhealthy",
        instance="serving-7",
        severity="error",
        action_id=12,
    )
    w.pump()
    assert w.store.query("SELECT state FROM notify_silence_requests WHERE action_id='12'") == [("released",)]
    [failed] = w.items("alertmanager")  # a failed restart is also a one-shot alert
    assert (
        failed.payload["alertname"] == "MedicRestartFailed"
        and failed.payload["ends_at"] == failed_event.ts + 3600
    )
    w.close()


def test_instance_down_fires_until_the_instance_is_back(world):
    w = world()
    w.events.emit("instance_restarted", "restarted: pid 1 → 2", instance="serving-7", severity="warning")
    w.pump()
    assert w.items() == []  # a restart with no alert open is not news
    w.events.emit("instance_down", "pid 2 is gone", instance="serving-7", severity="warning")
    w.events.emit("instance_restarted", "restarted: pid 2 → 3", instance="serving-7", severity="warning")
    w.pump()
    hook = [(i.payload["status"], i.payload["alertname"]) for i in w.items("webhook")]
    assert hook == [("firing", "MedicInstanceDown"), ("resolved", "MedicInstanceDown")]
    assert w.items("webhook")[0].payload["summary"] == "serving-7: pid 2 is gone"
    w.close()


def test_cursor_routes_each_event_once_across_router_restarts(world):
    w = world()
    w.events.emit("instance_down", "gone", instance="a")
    assert w.pump() == 2
    again = Router(w.config, w.store, w.outbox, w.sinks)  # the agent restarted: same store, same cursor
    assert again.pump(T0) == 0
    w.events.emit("instance_down", "gone", instance="b")
    assert again.pump(T0) == 2
    assert w.pump() == 0
    assert [i.instance for i in w.items("webhook")] == ["a", "b"]
    w.close()


def test_first_start_skips_history(tmp_path, monkeypatch):
    monkeypatch.setenv("HOOK_SECRET", "0123456789abcdef0123")
    store = Store(tmp_path)
    events = EventLog(store)
    events.emit("instance_down", "old news", instance="a")
    config = validate_config(
        {"notify": [{"type": "webhook", "url": "http://x", "secret_env": "HOOK_SECRET"}]}
    ).notify
    sinks = create_sinks(config)
    outbox = Outbox(store, config.retry)
    router = Router(config, store, outbox, sinks)
    assert router.pump(T0) == 0
    events.emit("instance_down", "news", instance="b")
    assert router.pump(T0) == 1
    sinks[0].close()


def test_reposts_keep_alerts_alive_and_coalesce(world):
    w = world()
    w.finding("opened")
    w.pump(T0)
    [item] = w.items("alertmanager")
    w.outbox.delivered(item, T0)
    assert w.router.repost(T0 + 30) == pytest.approx(30.0)  # not due yet
    assert len(w.items("alertmanager")) == 1
    w.router.repost(T0 + 61)
    w.router.repost(T0 + 122)  # the target is down: the re-post waiting is refreshed, not doubled
    pending = [i for i in w.items("alertmanager") if i.state == "pending"]
    assert len(pending) == 1 and pending[0].kind == "finding_opened"
    assert (
        w.items("webhook")[0].kind == "finding_opened" and len(w.items("webhook")) == 1
    )  # messages never repeat
    w.close()


def test_sink_kind_filter(world):
    w = world(
        {"type": "webhook", "url": "http://x", "secret_env": "HOOK_SECRET", "kinds": ["remediation_paused"]}
    )
    w.finding("opened")
    w.events.emit("remediation_paused", "paused until 14:00 by ops: deploy", by="ops")
    w.pump()
    assert [i.kind for i in w.items()] == ["paused"]
    w.close()


def test_dashboard_url_template(world):
    w = world(dashboard_url="https://grafana.example/d/medic?var-name={instance}&var-fleet={fleet}")
    w.finding("opened")
    w.pump()
    assert (
        w.items("alertmanager")[0].payload["link"]
        == "https://grafana.example/d/medic?var-name=serving-7&var-fleet=ranker"
    )
    w.close()


def test_every_alias_names_a_route():
    assert all(target in ROUTES for target in ALIASES.values())
    assert canonical("remediation_restart_succeeded") == "restart_done"
    assert canonical("finding_opened") == "finding_opened"


def test_a_broken_event_does_not_block_the_ones_behind_it(world):
    w = world()
    w.events.emit(
        "finding_opened", "odd", instance="x", finding={"kind": ["not", "a", "string"], "severity": {}}
    )
    w.events.emit("instance_down", "gone", instance="y")
    w.pump()
    assert "y" in [i.instance for i in w.items("webhook")]
    w.close()


def test_labels_are_never_asked_for_while_the_store_is_locked(world):
    """The tracker emits events under its lock and the store has its own: asking the tracker for labels
    inside a store transaction deadlocks the agent (seen in a real agent before this test existed)."""
    w = world()
    asked = []

    def labels_for(name):
        asked.append(name)
        assert not w.store._lock.locked(), "labels_for called inside a store transaction"
        return {"fleet": "ranker"}

    w.router.labels_for = labels_for
    w.events.emit("instance_down", "gone", instance="serving-3")
    w.finding("opened", instance="serving-4")
    w.pump()
    assert sorted(asked) == ["serving-3", "serving-4"]
    assert {i.payload["fleet"] for i in w.items()} == {"ranker"}
    w.close()


def test_the_link_is_one_on_call_can_open_or_none(world):
    """Never the agent's listen address: `notify.dashboard_url`, else `agent.external_url`'s dashboard."""
    w = world()
    assert (
        w.router.link("serving 7", "ranker") == "https://medic-ranker.example/dashboard#instance=serving%207"
    )
    assert w.router.link(None, None) == "https://medic-ranker.example/dashboard"
    w.router.external_url = None
    assert w.router.link("serving-7", "ranker") is None
    w.close()
    templated = world(dashboard_url="https://grafana.example/d/m?var-agent={agent}&var-name={instance}")
    assert (
        templated.router.link("serving-7", None)
        == "https://grafana.example/d/m?var-agent=ranker-7f9c&var-name=serving-7"
    )
    templated.close()
