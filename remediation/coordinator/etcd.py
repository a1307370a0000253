"""`etcd` coordinator: one budget for agents on many hosts, through etcd 3.4+'s JSON gateway.

Keys under `<prefix>/<namespace>/`:
    slots/<instance>          the restart in flight, attached to its holder's lease (TTL): a dead
                              agent stops renewing and etcd deletes the key, freeing the slot
    restarts/<ms>-<instance>  the restart's record (no lease, pruned after the retention), updated
                              with its expiry on each renewal and with its outcome on release
    clock                     rewritten by every acquisition
    fleet/<instance>          what an agent publishes, attached to that agent's fleet lease, and
                              written only when it changes (its lease is kept alive meanwhile)
    control/leader            the elected planner, attached to its lease: created by a txn that
                              requires it absent (create_revision 0); its create_revision fences
                              every grant the leader writes
    control/pause             the fleet-wide pause: while it holds nothing is granted and no slot
                              is taken; on a lease that ends just after its `until`, so it ends by
                              itself even with no agent left to lift it
    grants/<agent>            the leader's grants for that agent's instances, written on change
    profiles/<workload>       a workload's learned profile (`etcd_profiles.py`), on a lease of its own

Every agent watches `control/` (one stream; no request while nothing changes), and its own
`grants/<agent>` while it wants a restart; the leader also watches `fleet/`. A follower therefore
costs a lease keepalive every third of `fleet_ttl`, a write when its entries change, and a slot
acquisition when a grant comes due.

Acquire is optimistic: read `clock` (its mod revision R), the slots and the records, let the budget
decide, then one txn `clock unchanged since R AND slots/<instance> absent → put slot, record, clock`.
Any concurrent acquisition rewrites `clock`, so at most one of two racing agents succeeds and the
loser re-reads and asks the budget again. An acquisition under a grant also requires the leader
key's create_revision to still be the grant's: a grant from a deposed leader takes nothing. Releases and expiries only free capacity, so a view they
make stale is never too generous.
"""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from remediation.coordinator import etcd_profiles
from remediation.coordinator.base import (
    EXPIRED,
    AcquireResult,
    Admit,
    Coordinator,
    Grant,
    Leadership,
    PlannedGrant,
    SlotRequest,
    checked_time,
    fleet_pause_decision,
    read_pause,
)
from remediation.coordinator.etcd_gateway import EtcdGateway, answer_revision, b64
from remediation.coordinator.etcd_security import EtcdSecurity
from remediation.coordinator.etcd_watch import KeyWatch, wait_fresh
from remediation.deadlines import Clocks
from remediation.errors import CoordinatorError, CoordinatorUnavailable, LeaseLost
from remediation.model import Decision, FleetEntry, RestartRecord
from remediation.planner import stable_hash

LEADER = "control/leader"
PAUSE = "control/pause"
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
        security: EtcdSecurity | None = None,
    ) -> None:
        self.gateway = EtcdGateway(endpoints, timeout, security)
        self.base = f"{prefix}/{namespace}/"
        self.namespace = namespace
        self.retention = retention
        self.clock = clock
        self.clocks = Clocks.for_wall(clock)  # how long a fleet pause lasts (remediation.deadlines)
        self._lock = threading.Lock()
        self._held: dict[str, dict[str, Any]] = {}  # token -> the record this agent wrote
        self._fleet_lease: int | None = None
        self._fleet_renewed = 0.0  # monotonic time of the fleet lease's last grant or keepalive
        self._parsed: dict[str, tuple[int, FleetEntry | None]] = {}  # fleet key -> (mod revision, entry)
        self._published: dict[str, str] = {}  # instance -> what this agent last wrote (no updated_at)
        self._control: KeyWatch | None = None
        self._fleet_watch: KeyWatch | None = None
        self._grant_watch: KeyWatch | None = None
        self._leadership: Leadership | None = None
        self._leader_lease = 0
        self._leader_renewed = 0.0
        self._vacant_since: float | None = None
        self._written: dict[str, str] = {}  # agent -> grants document the leader last wrote
        self._fences: dict[str, int] = {}  # instance -> the revision its grant requires at acquire
        self._profile_lease = etcd_profiles.ProfileLease()  # what this agent's shared profiles hang on

    def describe(self) -> str:
        return f"etcd coordinator {self.gateway.describe()} (keys {self.base})"

    def close(self) -> None:
        for watch in (self._control, self._fleet_watch, self._grant_watch):
            if watch is not None:
                watch.close()
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
            paused = gw.get(self.base + PAUSE)  # read fresh: its revision guards the txn below
            pause = read_pause(paused["value"], now, self.clocks) if paused else None
            if pause is not None:
                return AcquireResult(None, fleet_pause_decision(pause))
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
            pause_key = self.base + PAUSE
            compare = [
                gw.unchanged(clock_key, clock_rev) if clock_rev is not None else gw.absent(clock_key),
                gw.absent(slot_key),
                gw.unchanged(pause_key, paused["mod_revision"]) if paused else gw.absent(pause_key),
            ]
            fence = self._fence_for(request.instance)
            if fence is not None:
                compare.append(_created_at(self.base + LEADER, fence))
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
            if fence is not None:
                current = gw.get(self.base + LEADER)
                if current is None or current["create_revision"] != fence:
                    self._fences.pop(request.instance, None)
                    return AcquireResult(None, _stale_grant(request.instance, fence))
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
            # another agent took a slot (or paused the fleet) between our read and our write: read
            # again, ask the budget again
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
        """Write the entries that changed (`updated_at` aside) and delete those gone; otherwise only
        keep the lease alive, every third of `ttl`."""
        gw = self.gateway
        with self._lock:
            lease, renewed, published = self._fleet_lease, self._fleet_renewed, dict(self._published)
        now = time.monotonic()
        if lease is not None and now - renewed >= ttl / 3:
            if gw.keepalive(lease) > 0:
                renewed = now
            else:
                lease = None  # expired: every entry went with it
        if lease is None:
            lease, _ = gw.grant(ttl)
            renewed, published = now, {}
        wanted = {
            e.instance: json.dumps({**e.to_dict(), "updated_at": None}, sort_keys=True) for e in entries
        }
        by_name = {e.instance: e for e in entries}
        ops = [gw.delete_op(self.base + "fleet/" + name) for name in published if name not in wanted]
        ops += [
            gw.put_op(self.base + "fleet/" + name, json.dumps(by_name[name].to_dict()), lease)
            for name, value in wanted.items()
            if published.get(name) != value
        ]
        try:
            for start in range(0, len(ops), MAX_TXN_OPS):
                gw.txn([], ops[start : start + MAX_TXN_OPS])
        except (CoordinatorUnavailable, CoordinatorError):
            with self._lock:
                self._fleet_lease, self._fleet_renewed, self._published = lease, renewed, {}
            raise  # unsure what was written: everything is written again next time
        with self._lock:
            self._fleet_lease, self._fleet_renewed, self._published = lease, renewed, wanted

    def fleet(self) -> list[FleetEntry]:
        """Every entry; the leader's come from its watched copy, parsed once per change."""
        watch = self._fleet_watch
        if watch is not None and watch.fresh:
            kvs = watch.items()
        else:
            kvs = {kv.pop("key"): kv for kv in self.gateway.range_prefix(self.base + "fleet/")[0]}
        parsed: dict[str, tuple[int, FleetEntry | None]] = {}
        for key, kv in kvs.items():
            known = self._parsed.get(key)
            if known is not None and known[0] == kv["mod_revision"]:
                parsed[key] = known
                continue
            try:
                parsed[key] = (kv["mod_revision"], FleetEntry.from_dict(_json(kv["value"])))
            except ValueError:
                parsed[key] = (kv["mod_revision"], None)  # another agent's bad entry: skipped
        self._parsed = parsed
        return sorted((e for _, e in parsed.values() if e is not None), key=lambda e: e.instance)

    # ----------------------------------------------------------------------------- the elected planner
    def _watch(self, key: str, prefix: bool) -> KeyWatch:
        watch = KeyWatch(self.gateway, key, prefix=prefix)
        watch.start()
        wait_fresh(watch, self.gateway.timeout)
        return watch

    def _control_watch(self) -> KeyWatch:
        if self._control is None:
            self._control = self._watch(self.base + "control/", True)
        return self._control

    def _fence_for(self, instance: str) -> int | None:
        with self._lock:
            fence = self._fences.get(instance)
            if fence is None and self._leadership is not None:
                fence = self._leadership.revision
        return fence

    def _current_leader(self) -> dict[str, Any] | None:
        control = self._control_watch()
        if not control.fresh:
            raise CoordinatorUnavailable(
                f"{self.describe()}: the watch on the leader key is down (reconnecting); "
                "no restart until it is back"
            )
        return control.get(self.base + LEADER)

    def leader(self) -> str | None:
        kv = self._current_leader()
        return (_json(kv["value"]) or {}).get("agent") if kv else None

    def leader_info(self) -> dict[str, Any] | None:
        """From the watched leader key: no request."""
        kv = self._current_leader()
        if kv is None:
            return None
        value = _json(kv["value"]) or {}
        agent = value.get("agent")
        return {
            "agent": agent if isinstance(agent, str) else "?",
            "revision": kv["create_revision"],
            "since": checked_time(value.get("since")),
        }

    def campaign(self, agent: str, ttl: float, spread: float = 0.0) -> Leadership | None:
        gw = self.gateway
        current = self._current_leader()
        now = time.monotonic()
        mine = self._leadership
        if mine is not None:
            if current is None or current["create_revision"] != mine.revision:
                self._step_down()
            elif now - self._leader_renewed >= ttl / 3:
                if gw.keepalive(self._leader_lease) > 0:
                    self._leader_renewed = now
                else:
                    self._step_down()
            if self._leadership is not None:
                return self._leadership
        if current is not None:
            self._vacant_since = None
            return None
        if self._vacant_since is None:
            self._vacant_since = now
        if spread > 0 and now - self._vacant_since < spread * (stable_hash(agent) % 1000) / 1000:
            return None  # an agent earlier in the hash order claims it first, and the watch says so
        lease, _ = gw.grant(ttl)
        key = self.base + LEADER
        value = json.dumps({"agent": agent, "since": self.clock()})
        try:
            data = gw.call(
                "kv/txn",
                {"compare": [gw.absent(key)], "success": [gw.put_op(key, value, lease)], "failure": []},
            )
        except (CoordinatorUnavailable, CoordinatorError):
            self._revoke_quietly(lease)
            raise
        if not data.get("succeeded"):
            self._revoke_quietly(lease)
            return None
        leadership = Leadership(agent, answer_revision(data), self.clock())
        written = {}
        for kv in gw.range_prefix(self.base + "grants/")[0]:
            written[kv["key"][len(self.base + "grants/") :]] = kv["value"]
        fleet_watch = self._fleet_watch or self._watch(self.base + "fleet/", True)
        with self._lock:
            self._leadership, self._leader_lease, self._leader_renewed = leadership, lease, now
            self._written, self._fleet_watch, self._vacant_since = written, fleet_watch, None
        return leadership

    def _step_down(self) -> None:
        with self._lock:
            self._leadership, self._written = None, {}
            watch, self._fleet_watch = self._fleet_watch, None
        if watch is not None:
            watch.close()

    def resign(self) -> None:
        lease = self._leader_lease if self._leadership is not None else 0
        self._step_down()
        if lease:
            self._revoke_quietly(lease)

    def write_grants(self, leadership: Leadership, grants: Mapping[str, Sequence[PlannedGrant]]) -> int:
        gw = self.gateway
        with self._lock:
            written = dict(self._written)
        docs = {
            agent: json.dumps([g.to_dict() for g in sorted(items, key=lambda g: g.instance)], sort_keys=True)
            for agent, items in grants.items()
            if items
        }
        ops = [gw.delete_op(self.base + "grants/" + agent) for agent in written if agent not in docs]
        ops += [gw.put_op(self.base + "grants/" + a, doc) for a, doc in docs.items() if written.get(a) != doc]
        fence = _created_at(self.base + LEADER, leadership.revision)
        for start in range(0, len(ops), MAX_TXN_OPS - 1):
            if not gw.txn([fence], ops[start : start + MAX_TXN_OPS - 1]):
                self._step_down()
                raise LeaseLost(
                    f"{self.describe()}: leadership (revision {leadership.revision}) was lost before "
                    "the grants were written; the new leader plans"
                )
        with self._lock:
            self._written = docs
        return sum(1 for a, doc in docs.items() if written.get(a) != doc) + sum(
            1 for a in written if a not in docs
        )

    def grants(self, agent: str) -> list[PlannedGrant] | None:
        current = self._current_leader()
        if self._grant_watch is None:
            self._grant_watch = self._watch(self.base + "grants/" + agent, False)
        watch = self._grant_watch
        control = self._control_watch()
        if not watch.fresh:
            return None
        if current is None or self._watched_pause(control) is not None:
            out: list[PlannedGrant] = []
        else:
            kv = watch.get(self.base + "grants/" + agent)
            out = [
                g for g in _grants(kv["value"] if kv else "[]") if g.revision == current["create_revision"]
            ]
        with self._lock:
            self._fences = {g.instance: g.revision for g in out}
        return out

    def _watched_pause(self, control: KeyWatch) -> dict[str, Any] | None:
        kv = control.get(self.base + PAUSE)
        return read_pause(kv["value"], self.clock(), self.clocks) if kv else None

    def fleet_pause(self) -> dict[str, Any] | None:
        self._current_leader()  # fails when the watch is down
        return self._watched_pause(self._control_watch())

    def set_fleet_pause(self, pause: dict[str, Any] | None) -> None:
        """Put the pause on a lease that ends a second after its `until` (none without one), or
        delete it; the lease of the pause it replaces is revoked."""
        gw, key = self.gateway, self.base + PAUSE
        old = gw.get(key)
        until = checked_time(pause.get("until")) if pause is not None else None
        lease = 0
        if pause is not None and until is not None:
            lease, _ = gw.grant(max(math.ceil(until - self.clock()) + 1, 2))
        try:
            if pause is None:
                gw.call("kv/deleterange", {"key": b64(key)})
            else:
                gw.call("kv/put", gw.put_op(key, json.dumps(pause), lease)["request_put"])
        except (CoordinatorUnavailable, CoordinatorError):
            if lease:
                self._revoke_quietly(lease)
            raise
        if old is not None and old["lease"]:
            self._revoke_quietly(old["lease"])

    # ----------------------------------------------------------------------------- workload profiles
    def put_profile(self, key: str, doc: Mapping[str, Any], ttl: float) -> None:
        etcd_profiles.put_profile(self.gateway, self.base, self._profile_lease, key, doc, ttl)

    def get_profiles(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        return etcd_profiles.get_profiles(self.gateway, self.base, keys)


def _shape_checked(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method`, with an answer it cannot read (a field missing, null or of another type: something
    other than etcd 3.4+ answers there) turned into a `CoordinatorError`: no restart, and why."""

    @functools.wraps(method)
    def checked(self: EtcdCoordinator, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise CoordinatorError(
                f"etcd answered {method.__name__} in a shape medic cannot read ({type(exc).__name__}: "
                f"{str(exc)[:200]}); is {self.describe()} an etcd 3.4+ client URL? No restart until it is"
            ) from None

    return checked


for _name in (
    "restarts", "acquire", "renew", "release", "publish", "fleet", "leader", "campaign", "resign",
    "write_grants", "grants", "fleet_pause", "set_fleet_pause", "put_profile", "get_profiles",
):  # fmt: skip
    setattr(EtcdCoordinator, _name, _shape_checked(getattr(EtcdCoordinator, _name)))


def _created_at(key: str, revision: int) -> dict:
    return {"target": "CREATE", "key": b64(key), "result": "EQUAL", "create_revision": str(revision)}


def _stale_grant(instance: str, revision: int) -> Decision:
    return Decision.block(
        "lock",
        "stale-grant",
        f"the grant for {instance} came from a leader that is no longer in charge (revision {revision}); "
        "waiting for the new leader's plan",
    )


def _grants(text: str) -> list[PlannedGrant]:
    try:
        items = json.loads(text)
    except ValueError:
        return []
    out = []
    for item in items if isinstance(items, list) else []:
        try:
            out.append(PlannedGrant.from_dict(item))
        except ValueError:
            continue  # a bad grant is no grant: that instance waits
    return out


def _json(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
