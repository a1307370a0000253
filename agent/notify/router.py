"""Events → notifications, per sink, into the outbox; and the state of the alerts that fire until resolved.

The router reads the event log after its cursor (`notify_cursor`), so an event stored while the
agent was busy, or just before it was killed, is still routed: routing a batch and moving the
cursor happen in one transaction. For each event it consults `routes.ROUTES`:

- alert sinks (Alertmanager) get `fire`/`resolve`/`once` effects, one outbox item per alert
  (dedup key `alert:<key>|<severity>`, replaced while pending: the latest state wins). When a
  finding changes severity, the old alert is resolved and a new one fires, because Alertmanager
  identifies alerts by their labels and severity is one of them.
- message sinks (webhook, Slack) get one item per event (dedup key `event:<id>`).
- a `resolve` goes only to the sinks that got the `fire`; `gated` kinds (findings) go only to
  sinks whose min_severity they reach (or that already got the alert).

Active alerts live in `notify_alerts`; `repost(now)` queues them again for Alertmanager every
repost interval, which keeps them from lapsing while they last.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol
from urllib.parse import quote

from agent.core.records import Event
from agent.notify.config import SEVERITY_RANK, NotifySection, fill
from agent.notify.event_alerts import (
    NOT_POSTED_BACK,
    Route,
    canonical,
    description_for,
    finding_of,
    route_for,
)
from agent.notify.model import Notification
from agent.notify.outbox import Outbox
from agent.state.store import Store

log = logging.getLogger("medic.notify")
BATCH = 200
_SCHEMA = """
CREATE TABLE IF NOT EXISTS notify_cursor (name TEXT PRIMARY KEY, event_id INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS notify_alerts (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    severity TEXT NOT NULL,
    sinks TEXT NOT NULL,
    notification TEXT NOT NULL,
    starts_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    reposted_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS notify_alerts_state ON notify_alerts (state, reposted_at);
"""


def ensure_router_schema(store: Store) -> None:
    store.ensure_schema(_SCHEMA)


class SinkView(Protocol):
    """What the router needs to know of a sink (`sinks.base.HttpSink` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def takes(self) -> str: ...

    @property
    def min_severity(self) -> str | None: ...

    def wants(self, canonical_kind: str) -> bool: ...


class SilenceBook(Protocol):
    """Where restart events record their silence requests (`silences.Silencer` is one)."""

    def request_in(
        self, db: sqlite3.Connection, instance: str, action_id: str, until: float, now: float
    ) -> None: ...

    def release_in(self, db: sqlite3.Connection, action_id: str, now: float) -> None: ...


@dataclass(frozen=True, slots=True)
class _Alert:
    key: str
    state: str
    severity: str
    sinks: list[str]
    notification: Notification
    starts_at: float


class Router:
    def __init__(
        self,
        config: NotifySection,
        store: Store,
        outbox: Outbox,
        sinks: Sequence[SinkView],
        *,
        labels_for: Callable[[str], Mapping[str, str]] = lambda name: {},
        agent: str | None = None,
        external_url: str | None = None,
        silences: SilenceBook | None = None,
        silence_for: float = 1800.0,
        repost_interval: float | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.outbox = outbox
        self.sinks = sinks
        self.labels_for = labels_for
        self.agent = agent  # the `agent` of every notification: replicas of a workload stay apart
        self.external_url = external_url
        self.silences = silences
        self.silence_for = silence_for
        self.repost_interval = repost_interval
        ensure_router_schema(store)
        self._init_cursor()

    # ----------------------------------------------------------------------------- the cursor
    def _init_cursor(self) -> None:
        """On the very first start, begin after the events already stored: history is not re-notified."""
        with self.store.transaction() as db:
            if db.execute("SELECT 1 FROM notify_cursor WHERE name='events'").fetchone() is None:
                last = db.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
                db.execute("INSERT INTO notify_cursor VALUES ('events', ?)", (last,))

    def cursor(self) -> int:
        event_id: int = self.store.query("SELECT event_id FROM notify_cursor WHERE name='events'")[0][0]
        return event_id

    def pump(self, now: float) -> int:
        """Route every event stored since the cursor; returns the number of outbox items queued."""
        queued = 0
        while True:
            events = self.store.events(after_id=self.cursor(), limit=BATCH)
            if not events:
                return queued
            labels = self._labels(events)  # before the transaction: never ask others while holding the store
            with self.store.transaction() as db:
                for event in events:
                    try:
                        queued += self.route(db, event, now, labels)
                    except Exception:  # one odd event must not block the queue behind it
                        log.exception("cannot route event %s (%s); skipped", event.id, event.kind)
                db.execute("UPDATE notify_cursor SET event_id=? WHERE name='events'", (events[-1].id,))
            if len(events) < BATCH:
                return queued

    # ----------------------------------------------------------------------------- one event
    def _labels(self, events: list[Event]) -> dict[str, dict[str, str]]:
        names = {e.instance or finding_of(e).get("instance") for e in events if route_for(e.kind) is not None}
        out = {}
        for name in names:
            if isinstance(name, str) and name:
                try:
                    out[name] = {str(k): str(v) for k, v in self.labels_for(name).items()}
                except Exception:
                    log.exception("cannot read the labels of %s", name)
        return out

    def route(
        self, db: sqlite3.Connection, event: Event, now: float, labels: Mapping[str, Mapping[str, str]]
    ) -> int:
        """Queue what one event means for each sink, inside the caller's transaction."""
        route = route_for(event.kind)
        if route is None:
            return 0
        kind = canonical(event.kind)
        note = self.notification(event, route, kind, labels)
        self._silence(db, route, note, event.data.get("until"), now)
        if route.effect == "fire":
            return self._fire(db, route, note, now)
        if route.effect == "resolve":
            return self._resolve(db, route, note, now)
        queued = 0
        for sink in self.sinks:
            if not sink.wants(kind) or (sink.takes == "alerts" and route.effect is None):
                continue
            queued += self._put(db, sink, note, now)
        return queued

    def notification(
        self, event: Event, route: Route, kind: str, known: Mapping[str, Mapping[str, str]]
    ) -> Notification:
        finding = finding_of(event)
        instance = event.instance or finding.get("instance") or None
        labels = dict(known.get(instance, {})) if isinstance(instance, str) else {}
        fleet = labels.get(self.config.fleet_label) or _text(event.data.get("fleet"))
        given = finding.get("severity")
        severity = given if isinstance(given, str) and given in SEVERITY_RANK else event.severity
        if finding:
            summary = str(finding.get("summary") or event.message)
            given_evidence = finding.get("evidence")
            evidence = given_evidence if isinstance(given_evidence, dict) else {}
        else:
            summary = f"{instance}: {event.message}" if instance else event.message
            evidence = {k: v for k, v in event.data.items() if k != "finding"}
        status = {"fire": "firing", "once": "firing", "resolve": "resolved"}.get(route.effect or "", "info")
        alertname = route.alert_name(event) if route.effect else None
        return Notification(
            key=route.key(event) if route.key else f"event/{event.id}",
            status=status,  # type: ignore[arg-type]
            event_kind=kind,
            event_id=event.id,
            ts=event.ts,
            severity=severity,
            summary=summary,
            message=event.message,
            alertname=alertname,
            instance=instance,
            agent=self.agent,
            fleet=fleet,
            kind=_text(finding.get("kind")),
            evidence=evidence,
            labels=labels,
            finding_id=_text(finding.get("id") or event.data.get("finding_id")),
            action_id=_text(event.data.get("action_id")),
            starts_at=event.ts,
            ends_at=event.ts + route.lasts if route.effect == "once" else None,
            link=self.link(instance, fleet),
            runbook=fill(self.config.runbook_url, alertname=alertname.lower()) if alertname else None,
            description=description_for(alertname, instance),
            data={"kind": event.kind},
        )

    def link(self, instance: str | None, fleet: str | None) -> str | None:
        """`notify.dashboard_url` filled in, else the agent's dashboard at `agent.external_url`, else
        none: the agent's listen address (loopback, a pod IP) is not a page on-call can open."""
        template = self.config.dashboard_url
        if template:
            values = {"instance": instance or "", "fleet": fleet or "", "agent": self.agent or ""}
            return fill(template, **{k: quote(v, safe="") for k, v in values.items()})
        if not self.external_url:
            return None
        return f"{self.external_url.rstrip('/')}/dashboard" + (
            f"#instance={quote(instance, safe='')}" if instance else ""
        )

    # ----------------------------------------------------------------------------- effects
    def _fire(self, db: sqlite3.Connection, route: Route, note: Notification, now: float) -> int:
        current = self._alert(db, note.key)
        firing = current if current is not None and current.state == "firing" else None
        had = set(firing.sinks) if firing else set()
        targets = [
            s
            for s in self.sinks
            if s.wants(note.event_kind)
            and (s.name in had or not route.gated or self._meets(s, note.severity))
        ]
        targets = [s for s in targets if not (s.takes == "alerts" and note.kind in NOT_POSTED_BACK)]
        if not targets and firing is None:
            return 0
        if firing is not None:
            note = replace(note, starts_at=firing.starts_at)
        queued = 0
        for sink in targets:
            if sink.takes == "alerts" and firing is not None and sink.name in had:
                old = firing.notification
                if old.severity != note.severity:  # labels change: end the old alert, fire the new one
                    ended = replace(old, status="resolved", ends_at=note.ts, ts=note.ts)
                    queued += self._put(db, sink, ended, now)
            queued += self._put(db, sink, note, now)
        sinks = sorted(had | {s.name for s in targets})
        db.execute(
            """INSERT INTO notify_alerts VALUES (?, 'firing', ?, ?, ?, ?, ?, ?)
               ON CONFLICT (key) DO UPDATE SET state='firing', severity=excluded.severity, sinks=excluded.sinks,
               notification=excluded.notification, starts_at=excluded.starts_at, updated_at=excluded.updated_at,
               reposted_at=excluded.reposted_at""",
            (note.key, note.severity, json.dumps(sinks), _dump(note), note.starts_at, now, now),
        )
        return queued

    def _resolve(self, db: sqlite3.Connection, route: Route, note: Notification, now: float) -> int:
        current = self._alert(db, note.key)
        if current is None or current.state != "firing":
            return 0
        old = current.notification  # same labels as the firing alert, or Alertmanager would not match it
        ended = replace(
            old,
            status="resolved",
            event_kind=note.event_kind,
            event_id=note.event_id,
            ts=note.ts,
            ends_at=note.ts,
            summary=note.summary if note.kind else f"resolved: {note.summary}",
            message=note.message,
            evidence=note.evidence or old.evidence,
            data=note.data,
        )
        queued = 0
        for sink in self.sinks:
            if sink.name in current.sinks:
                queued += self._put(db, sink, ended, now)
        db.execute(
            "UPDATE notify_alerts SET state='resolved', notification=?, updated_at=? WHERE key=?",
            (_dump(ended), now, note.key),
        )
        return queued

    def _silence(
        self, db: sqlite3.Connection, route: Route, note: Notification, until: Any, now: float
    ) -> None:
        """Restart events hold silences until the event's `until` (unix time), else `silence_for` from now."""
        if self.silences is None or not note.action_id or not (route.silence or route.unsilence):
            return
        if route.silence and note.instance:
            valid = isinstance(until, (int, float)) and not isinstance(until, bool) and math.isfinite(until)
            end = float(until) if valid and until > note.ts else note.ts + self.silence_for
            self.silences.request_in(db, note.instance, note.action_id, end, now)
        if route.unsilence:
            self.silences.release_in(db, note.action_id, now)

    def _put(self, db: sqlite3.Connection, sink: SinkView, note: Notification, now: float) -> int:
        if sink.takes == "alerts":
            key, replace_pending = f"alert:{note.key}|{note.severity}", True
        else:
            key, replace_pending = f"event:{note.event_id}", False
        queued = self.outbox.enqueue(
            db,
            sink=sink.name,
            dedup_key=key,
            payload=note.to_dict(),
            kind=note.event_kind,
            instance=note.instance,
            now=now,
            replace=replace_pending,
        )
        return 0 if queued is None else 1

    def _meets(self, sink: SinkView, severity: str) -> bool:
        threshold = sink.min_severity or self.config.min_severity
        return SEVERITY_RANK.get(severity, 0) >= SEVERITY_RANK[threshold]

    def _alert(self, db: sqlite3.Connection, key: str) -> _Alert | None:
        row = db.execute(
            "SELECT key, state, severity, sinks, notification, starts_at FROM notify_alerts WHERE key=?",
            (key,),
        ).fetchone()
        if row is None:
            return None
        return _Alert(
            row[0], row[1], row[2], json.loads(row[3]), Notification.from_dict(json.loads(row[4])), row[5]
        )

    # ----------------------------------------------------------------------------- re-posting
    def repost(self, now: float) -> float | None:
        """Queue active alerts again for their Alertmanager sinks; seconds until the next re-post is due."""
        alert_sinks = [s for s in self.sinks if s.takes == "alerts"]
        if not alert_sinks or not self.repost_interval:
            return None
        interval = self.repost_interval
        with self.store.transaction() as db:
            rows = db.execute(
                "SELECT key FROM notify_alerts WHERE state='firing' AND reposted_at <= ?", (now - interval,)
            ).fetchall()
            for (key,) in rows:
                alert = self._alert(db, key)
                assert alert is not None
                for sink in alert_sinks:
                    if sink.name in alert.sinks:
                        self._put(db, sink, alert.notification, now)
                db.execute("UPDATE notify_alerts SET reposted_at=? WHERE key=?", (now, key))
            oldest = db.execute("SELECT min(reposted_at) FROM notify_alerts WHERE state='firing'").fetchone()[
                0
            ]
        return None if oldest is None else max(0.0, oldest + interval - now)

    def prune(self, now: float, keep: float) -> None:
        with self.store.transaction() as db:
            db.execute("DELETE FROM notify_alerts WHERE state='resolved' AND updated_at < ?", (now - keep,))


def _text(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return str(value)


def _dump(note: Notification) -> str:
    return json.dumps(note.to_dict(), default=str, separators=(",", ":"))
