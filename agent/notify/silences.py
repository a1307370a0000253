"""Alertmanager silences held while medic remediates an instance, so nobody is paged for a repair.

`silence_for(instance, action_id, until)` records a request (durable, cheap, any thread);
`unsilence(action_id)` releases it. The notifier's worker calls `reconcile(now)`, which talks to
every Alertmanager sink with `silences: true`:

- for each active request, the alerts firing in Alertmanager that belong to the instance (one of
  `receiver.instance_labels` equals its name, as medic's own alerts' `name` does, and their `agent`,
  if they carry one, is this agent: a replica of the same workload watched by another agent keeps
  its alerts) get a silence
  matching exactly their labels, created by `sidecar-medic`, with the action id and the alert's
  fingerprint in the comment, ending at `until`. Idempotent on the fingerprint: an alert already
  covered by a medic silence (recorded here, or found in Alertmanager after a crash) gets no
  second one. New alerts of the instance (e.g. "instance down" during the restart) are picked up
  every `silence_refresh` while the request lasts.
- for each released request, its silences are expired (`DELETE /api/v2/silence/{id}`), unless
  another active request still uses the same silence.

A request past `until` lapses by itself; so do its silences (Alertmanager ends them at `endsAt`),
which bounds what an agent crash in the middle of a remediation can leave behind.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.core.bounded import bounded_request
from agent.notify.model import rfc3339
from agent.notify.sinks.base import ANSWER_DEADLINE_FACTOR, MAX_ANSWER_BYTES, DeliveryError, check
from agent.state.store import Store

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("medic.notify")
CREATED_BY = "sidecar-medic"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS notify_silence_requests (
    action_id TEXT PRIMARY KEY, instance TEXT NOT NULL, until REAL NOT NULL,
    state TEXT NOT NULL, created_at REAL NOT NULL, released_at REAL);
CREATE TABLE IF NOT EXISTS notify_silences (
    sink TEXT NOT NULL, fingerprint TEXT NOT NULL, action_id TEXT NOT NULL, silence_id TEXT NOT NULL,
    instance TEXT NOT NULL, alertname TEXT, until REAL NOT NULL, state TEXT NOT NULL,
    created_at REAL NOT NULL, expired_at REAL,
    PRIMARY KEY (sink, fingerprint, action_id));
"""


@dataclass(frozen=True, slots=True)
class SilenceTarget:
    """An Alertmanager that takes silences: its name, base URL and HTTP client.

    `urls` are the replicas of an HA Alertmanager (they gossip silences to each other): each
    request goes to the one that answered last, and to the next when it cannot be reached or
    answers 5xx; an answer that no retry can fix (a 4xx) is not tried elsewhere."""

    name: str
    url: str
    client: httpx.Client
    urls: tuple[str, ...] = ()
    preferred: list[int] = field(default_factory=lambda: [0])  # the index that answered last

    @property
    def replicas(self) -> tuple[str, ...]:
        return self.urls or (self.url,)


def ensure_silence_schema(store: Store) -> None:
    store.ensure_schema(_SCHEMA)


def belongs(
    labels: dict[str, Any], instance: str, instance_labels: list[str], agent: str | None = None
) -> bool:
    """Whether an alert is about this agent's `instance`."""
    if agent is not None and labels.get("agent") not in (None, "", agent):
        return False
    return any(labels.get(name) == instance for name in instance_labels)


def silence_body(
    labels: dict[str, str], fingerprint: str, instance: str, action_id: str, now: float, until: float
) -> dict[str, Any]:
    return {
        "matchers": [
            {"name": name, "value": value, "isRegex": False, "isEqual": True}
            for name, value in sorted(labels.items())
        ],
        "startsAt": rfc3339(now),
        "endsAt": rfc3339(until),
        "createdBy": CREATED_BY,
        "comment": f"medic is remediating {instance} (action {action_id}); fingerprint={fingerprint}",
    }


class Silencer:
    def __init__(
        self,
        store: Store,
        targets: list[SilenceTarget],
        instance_labels: list[str],
        *,
        refresh: float = 5.0,
        wake: Callable[[], None] = lambda: None,
        agent: str | None = None,
    ) -> None:
        self.store = store
        self.targets = targets
        self.instance_labels = instance_labels
        self.agent = agent
        self.refresh = refresh
        self.wake = wake
        ensure_silence_schema(store)

    # ----------------------------------------------------------------------------- requests
    def request_in(
        self, db: sqlite3.Connection, instance: str, action_id: str, until: float, now: float
    ) -> None:
        db.execute(
            """INSERT INTO notify_silence_requests VALUES (?, ?, ?, 'active', ?, NULL)
               ON CONFLICT (action_id) DO UPDATE SET until=max(until, excluded.until) WHERE state='active'""",
            (str(action_id), instance, until, now),
        )

    def release_in(self, db: sqlite3.Connection, action_id: str, now: float) -> None:
        db.execute(
            "UPDATE notify_silence_requests SET state='released', released_at=? WHERE action_id=? AND state='active'",
            (now, str(action_id)),
        )

    def silence_for(
        self, instance: str, action_id: str | int, until: float, now: float | None = None
    ) -> None:
        """Hold silences for the instance's firing alerts until `until` or `unsilence(action_id)`."""
        with self.store.transaction() as db:
            self.request_in(db, instance, str(action_id), until, time.time() if now is None else now)
        self.wake()

    def unsilence(self, action_id: str | int, now: float | None = None) -> None:
        """Release the silences of `action_id` (idempotent); the worker expires them within a second."""
        with self.store.transaction() as db:
            self.release_in(db, str(action_id), time.time() if now is None else now)
        self.wake()

    def silences(self, state: str | None = "active") -> list[dict[str, Any]]:
        sql = "SELECT sink, fingerprint, action_id, silence_id, instance, alertname, until, state FROM notify_silences"
        rows = self.store.query(sql + (" WHERE state=?" if state else ""), (state,) if state else ())
        keys = ("sink", "fingerprint", "action_id", "silence_id", "instance", "alertname", "until", "state")
        return [dict(zip(keys, row)) for row in rows]

    # ----------------------------------------------------------------------------- reconcile
    def reconcile(self, now: float) -> float | None:
        """Create and expire silences as the requests say; seconds until it wants to run again."""
        with self.store.transaction() as db:
            db.execute(
                """UPDATE notify_silence_requests SET state='released', released_at=until
                   WHERE state='active' AND until <= ?""",
                (now,),
            )
        active = self.store.query(
            "SELECT action_id, instance, until FROM notify_silence_requests WHERE state='active'"
        )
        for target in self.targets:
            try:
                if active:
                    self._cover(target, active, now)
                self._expire(target, now)
            except DeliveryError as exc:
                log.warning("silences on %s: %s; retrying in %.0fs", target.name, exc, self.refresh)
        pending = self.store.query(
            """SELECT count(*) FROM notify_silences s WHERE state='active' AND NOT EXISTS (SELECT 1 FROM
               notify_silence_requests r WHERE r.action_id=s.action_id AND r.state='active')"""
        )[0][0]
        return self.refresh if active or pending else None

    def _cover(self, target: SilenceTarget, active: list[tuple[Any, ...]], now: float) -> None:
        alerts = _get(target, "/api/v2/alerts", {"active": "true", "silenced": "true", "inhibited": "true"})
        known = {
            (fp, action): sid
            for fp, action, sid in self.store.query(
                "SELECT fingerprint, action_id, silence_id FROM notify_silences WHERE sink=? AND state='active'",
                (target.name,),
            )
        }
        by_fingerprint = {fp: sid for (fp, _), sid in known.items()}
        existing: dict[str, str] | None = None
        for action_id, instance, until in active:
            for alert in alerts if isinstance(alerts, list) else []:
                labels, fingerprint = alert.get("labels") or {}, alert.get("fingerprint")
                if not fingerprint or not belongs(labels, instance, self.instance_labels, self.agent):
                    continue
                if (fingerprint, action_id) in known:
                    continue
                silence_id = by_fingerprint.get(fingerprint)
                if silence_id is None:
                    if existing is None:
                        existing = self._medic_silences(target)
                    silence_id = existing.get(fingerprint)
                if silence_id is None:
                    body = silence_body(labels, fingerprint, instance, action_id, now, until)
                    answer = _send(target, "POST", "/api/v2/silences", body)
                    silence_id = str(answer.get("silenceID", "")) if isinstance(answer, dict) else ""
                    if not silence_id:
                        raise DeliveryError(f"{target.name} created a silence but gave no silenceID", True)
                    log.info(
                        "silenced %s on %s for %s (action %s)",
                        labels.get("alertname"),
                        target.name,
                        instance,
                        action_id,
                    )
                by_fingerprint[fingerprint] = silence_id
                known[(fingerprint, action_id)] = silence_id
                with self.store.transaction() as db:
                    db.execute(
                        "INSERT OR REPLACE INTO notify_silences VALUES (?, ?, ?, ?, ?, ?, ?, 'active', ?, NULL)",
                        (
                            target.name,
                            fingerprint,
                            action_id,
                            silence_id,
                            instance,
                            labels.get("alertname"),
                            until,
                            now,
                        ),
                    )

    def _medic_silences(self, target: SilenceTarget) -> dict[str, str]:
        """Fingerprint → id of the live silences medic made (found again after a crash)."""
        found: dict[str, str] = {}
        silences = _get(target, "/api/v2/silences", {})
        for silence in silences if isinstance(silences, list) else []:
            state = (silence.get("status") or {}).get("state")
            comment = str(silence.get("comment", ""))
            if (
                silence.get("createdBy") == CREATED_BY
                and state in ("active", "pending")
                and "fingerprint=" in comment
            ):
                found[comment.rsplit("fingerprint=", 1)[1].strip()] = str(silence.get("id"))
        return found

    def _expire(self, target: SilenceTarget, now: float) -> None:
        rows = self.store.query(
            """SELECT s.silence_id, s.fingerprint, s.action_id, s.until FROM notify_silences s
               WHERE s.sink=? AND s.state='active' AND NOT EXISTS (SELECT 1 FROM notify_silence_requests r
               WHERE r.action_id=s.action_id AND r.state='active')""",
            (target.name,),
        )
        for silence_id, fingerprint, action_id, until in rows:
            still_used = self.store.query(
                """SELECT 1 FROM notify_silences s JOIN notify_silence_requests r ON r.action_id=s.action_id
                   WHERE s.sink=? AND s.silence_id=? AND s.state='active' AND r.state='active' LIMIT 1""",
                (target.name, silence_id),
            )
            if not still_used and until > now:
                _expire_silence(target, silence_id)
                log.info("expired silence %s on %s (action %s done)", silence_id, target.name, action_id)
            with self.store.transaction() as db:
                db.execute(
                    "UPDATE notify_silences SET state='expired', expired_at=? WHERE sink=? AND fingerprint=? AND action_id=?",
                    (now, target.name, fingerprint, action_id),
                )


def _expire_silence(target: SilenceTarget, silence_id: str) -> None:
    try:
        _send(target, "DELETE", f"/api/v2/silence/{silence_id}", None)
    except DeliveryError:
        silence = _get(target, f"/api/v2/silence/{silence_id}", {})  # already expired or gone is fine
        if isinstance(silence, dict) and (silence.get("status") or {}).get("state") in ("active", "pending"):
            raise


def _get(target: SilenceTarget, path: str, params: dict[str, str]) -> Any:
    return _send(target, "GET", path, None, params)


def _send(
    target: SilenceTarget, method: str, path: str, body: Any, params: dict[str, str] | None = None
) -> Any:
    """One request to the first replica that answers; the last replica's error when none does."""
    replicas = target.replicas
    first = target.preferred[0] % len(replicas)
    problems = []
    for step in range(len(replicas)):
        index = (first + step) % len(replicas)
        try:
            answer = _send_to(target, replicas[index], method, path, body, params)
        except DeliveryError as exc:
            if not exc.retryable or len(replicas) == 1:
                raise
            problems.append(str(exc))
            continue
        target.preferred[0] = index
        return answer
    raise DeliveryError(f"no replica of {target.name} answered: {'; '.join(problems)}", True)


def _send_to(
    target: SilenceTarget, base: str, method: str, path: str, body: Any, params: dict[str, str] | None
) -> Any:
    import httpx  # loaded by the sink that made target.client

    url = f"{base}{path}"
    try:
        response = bounded_request(
            target.client,
            method,
            url,
            max_bytes=MAX_ANSWER_BYTES,
            seconds=ANSWER_DEADLINE_FACTOR * (target.client.timeout.read or 10.0),
            params=params,
            content=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"} if body is not None else None,
        )
    except httpx.TimeoutException:
        raise DeliveryError(f"{url} did not answer in time", True) from None
    except httpx.HTTPError as exc:
        raise DeliveryError(f"cannot reach {url}: {type(exc).__name__}: {exc}", True) from None
    if response.status_code == 404 and method == "GET" and "/silence/" in path:
        return {}
    check(response)
    try:
        return response.json() if response.content else None
    except ValueError:
        raise DeliveryError(f"{url} answered with non-JSON content", False) from None
