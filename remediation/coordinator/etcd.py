"""`etcd` coordinator: one budget for agents on many hosts, through etcd 3.4+'s JSON gateway.

Keys under `<prefix>/<namespace>/`:
    slots/<instance>          the restart in flight, attached to its holder's lease (TTL): a dead
                              agent stops renewing and etcd deletes the key, freeing the slot
    restarts/<ms>-<instance>  the restart's record (no lease, pruned after the retention), updated
                              with its expiry on each renewal and with its outcome on release
    clock                     rewritten by every acquisition
    fleet/<instance>          what an agent publishes, attached to that agent's fleet lease

Acquire is optimistic: read `clock` (its mod revision R), the slots and the records, let the budget
decide, then one txn `clock unchanged since R AND slots/<instance> absent → put slot, record, clock`.
Any concurrent acquisition rewrites `clock`, so at most one of two racing agents succeeds and the
loser re-reads and asks the budget again. Releases and expiries only free capacity, so a view they
make stale is never too generous.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from remediation.coordinator.base import EXPIRED, AcquireResult, Admit, Coordinator, Grant, SlotRequest
from remediation.coordinator.etcd_gateway import EtcdGateway
from remediation.errors import CoordinatorError, CoordinatorUnavailable, LeaseLost
from remediation.model import Decision, FleetEntry, RestartRecord

MAX_TXN_OPS = 100  # etcd refuses more than --max-txn-ops (default 128) operations in one txn
_ATTEMPTS = 5


class EtcdCoordinator(Coordinator):
    name = "etcd"

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        prefix: str = "/medic",
        namespace: str = "default",
        retention: float = 86400.0,
        timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.gateway = EtcdGateway(endpoints, timeout)
        self.base = f"{prefix}/{namespace}/"
        self.namespace = namespace
        self.retention = retention
        self.clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, dict[str, Any]] = {}  # token -> the record this agent wrote
        self._fleet_lease: int | None = None

    def describe(self) -> str:
        return f"etcd coordinator {', '.join(self.gateway.endpoints)} (keys {self.base})"

    def close(self) -> None:
        self.gateway.close()

    # ----------------------------------------------------------------------------- reading
    def _snapshot(self) -> tuple[int | None, dict[str, dict], list[tuple[str, dict]]]:
        """(mod revision of `clock` or None, slots by instance, records with their keys)."""
        clock = self.gateway.get(self.base + "clock")
        slots: dict[str, dict] = {}
        for kv in self.gateway.range_prefix(self.base + "slots/")[0]:
            value = _json(kv["value"])
            if value is not None:
                value["lease"] = kv["lease"]
                slots[kv["key"].rsplit("/", 1)[-1]] = value
        records = []
        for kv in self.gateway.range_prefix(self.base + "restarts/")[0]:
            value = _json(kv["value"])
            if value is not None:
                records.append((kv["key"], value))
        return (clock["mod_revision"] if clock else None), slots, records

    def _records(
        self, slots: dict[str, dict], raw: list[tuple[str, dict]], since: float
    ) -> list[RestartRecord]:
        out = []
        for _, value in raw:
            if value.get("finished_at") is None:
                slot = slots.get(value.get("instance", ""))
                if slot is None or slot.get("token") != value.get("token"):
                    value = {**value, "finished_at": value.get("expires_at"), "outcome": EXPIRED}
            try:
                record = RestartRecord.from_dict(value)
            except ValueError:
                continue  # a bad record of another agent must not block every restart
            if record.finished_at is None or record.finished_at >= since or record.started_at >= since:
                out.append(record)
        out.sort(key=lambda r: (r.started_at, r.instance))
        return out

    def restarts(self, since: float) -> list[RestartRecord]:
        _, slots, raw = self._snapshot()
        return self._records(slots, raw, since)

    # ----------------------------------------------------------------------------- slots
    def acquire(self, request: SlotRequest, admit: Admit) -> AcquireResult:
        gw = self.gateway
        for _ in range(_ATTEMPTS):
            clock_rev, slots, raw = self._snapshot()
            now = self.clock()
            decision = admit(self._records(slots, raw, now - self.retention), now)
            if not decision.ok:
                return AcquireResult(None, decision)
            lease, _ = gw.grant(request.ttl)
            token = f"{lease}"
            record_key = f"{self.base}restarts/{int(now * 1000):016d}-{request.instance}"
            record = {
                "instance": request.instance,
                "fleet": request.fleet,
                "holder": request.holder,
                "started_at": now,
                "expires_at": now + request.ttl,
                "finished_at": None,
                "outcome": None,
                "token": token,
                "key": record_key,
            }
            slot_key = self.base + "slots/" + request.instance
            clock_key = self.base + "clock"
            compare = [
                gw.unchanged(clock_key, clock_rev) if clock_rev is not None else gw.absent(clock_key),
                gw.absent(slot_key),
            ]
            success = [
                gw.put_op(
                    slot_key, json.dumps({"token": token, "holder": request.holder, "started_at": now}), lease
                ),
                gw.put_op(record_key, json.dumps(record)),
                gw.put_op(clock_key, json.dumps({"last": now, "by": request.holder})),
            ]
            success += [gw.delete_op(key) for key in self._expired_keys(raw, slots, now)][: MAX_TXN_OPS - 3]
            try:
                won = gw.txn(compare, success)
            except (CoordinatorUnavailable, CoordinatorError):
                self._revoke_quietly(lease)
                raise
            if won:
                with self._lock:
                    self._held[token] = record
                grant = Grant(request.instance, request.fleet, request.holder, token, now, request.ttl)
                return AcquireResult(grant, Decision.allow("lock", f"slot taken in {self.describe()}"))
            self._revoke_quietly(lease)
            holder = gw.get(slot_key)
            if holder is not None:
                other = _json(holder["value"]) or {}
                return AcquireResult(
                    None,
                    Decision.block(
                        "lock",
                        "in-flight",
                        f"{request.instance} is already being restarted by {other.get('holder', 'another agent')}",
                    ),
                )
            # another agent took a slot between our read and our write: read again, ask the budget again
        raise CoordinatorUnavailable(
            f"{self.describe()}: lost the race for a restart slot {_ATTEMPTS} times in a row; trying again later"
        )

    def _expired_keys(self, raw: list[tuple[str, dict]], slots: dict[str, dict], now: float) -> list[str]:
        cutoff = now - self.retention
        old = []
        for key, value in raw:
            finished = value.get("finished_at")
            if finished is None and slots.get(value.get("instance", ""), {}).get("token") != value.get(
                "token"
            ):
                finished = value.get("expires_at")
            started = value.get("started_at")
            numbers = isinstance(finished, (int, float)) and isinstance(started, (int, float))
            if numbers and finished < cutoff and started < cutoff:
                old.append(key)
        return old

    def _revoke_quietly(self, lease: int) -> None:
        try:
            self.gateway.revoke(lease)
        except (CoordinatorUnavailable, CoordinatorError):
            pass  # it expires by itself

    def renew(self, grant: Grant) -> float:
        ttl = self.gateway.keepalive(int(grant.token))
        if ttl <= 0:
            raise LeaseLost(
                f"the restart slot of {grant.instance} in {self.describe()} expired before it was renewed; "
                "another agent may hold it now"
            )
        expires = self.clock() + ttl
        with self._lock:
            record = self._held.get(grant.token)
        if record is not None:
            record = {**record, "expires_at": expires}
            self.gateway.call("kv/put", self.gateway.put_op(record["key"], json.dumps(record))["request_put"])
            with self._lock:
                self._held[grant.token] = record
        return expires

    def release(self, grant: Grant, outcome: str) -> None:
        with self._lock:
            record = self._held.get(grant.token)
        if record is not None and record.get("finished_at") is None:
            finished = {**record, "finished_at": self.clock(), "outcome": outcome}
            self.gateway.call(
                "kv/put", self.gateway.put_op(record["key"], json.dumps(finished))["request_put"]
            )
        self.gateway.revoke(int(grant.token))
        with self._lock:
            self._held.pop(grant.token, None)

    # ----------------------------------------------------------------------------- fleet view
    def publish(self, agent: str, entries: Sequence[FleetEntry], ttl: float) -> None:
        gw = self.gateway
        with self._lock:
            lease = self._fleet_lease
        if lease is None or gw.keepalive(lease) <= 0:
            lease, _ = gw.grant(ttl)
            with self._lock:
                self._fleet_lease = lease
        wanted = {e.instance for e in entries}
        ops = [
            gw.delete_op(kv["key"])
            for kv in gw.range_prefix(self.base + "fleet/")[0]
            if (_json(kv["value"]) or {}).get("agent") == agent and kv["key"].rsplit("/", 1)[-1] not in wanted
        ]
        ops += [gw.put_op(self.base + "fleet/" + e.instance, json.dumps(e.to_dict()), lease) for e in entries]
        for start in range(0, len(ops), MAX_TXN_OPS):
            gw.txn([], ops[start : start + MAX_TXN_OPS])

    def fleet(self) -> list[FleetEntry]:
        entries = []
        for kv in self.gateway.range_prefix(self.base + "fleet/")[0]:
            try:
                entries.append(FleetEntry.from_dict(_json(kv["value"])))
            except ValueError:
                continue
        return sorted(entries, key=lambda e: e.instance)


def _json(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
