"""The lease store on etcd 3.4+, through its JSON gateway (`etcd_gateway.py`), under `<prefix>/<namespace>/`.

    read      one txn of range requests, whatever the number of keys and prefixes (one consistent
              revision); with `recent`, from a copy read at most `RECENT` seconds ago (the reads of
              one engine step share one request, and nothing is held open between steps); with
              `watch`, from copies kept current by watch streams (`etcd_watch.py`): no request while
              nothing changes, and a fresh read while a stream is down. A stream holds ~70 KiB of
              etcd's memory, so only the leader watches (the whole fleet, which it reads every step)
    commit    one txn: each expected revision a compare (`CREATE == 0` for an absent key, `MOD == r`
              else), the puts and deletes its success branch
    grant, keepalive, revoke   etcd's leases, one request each

An answer that is not of etcd's shape (a field missing, null or of another type: something other than
etcd answers there) is a `CoordinatorError` that says so: no restart, and why.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from remediation.coordinator.etcd_gateway import EtcdGateway, answer_revision, b64, prefix_end
from remediation.coordinator.etcd_security import EtcdSecurity
from remediation.coordinator.etcd_watch import KeyWatch, wait_fresh
from remediation.coordinator.store import ABSENT, Change, Item, Snapshot
from remediation.errors import CoordinatorError

MAX_TXN_OPS = 100  # etcd refuses more than --max-txn-ops (default 128) operations in one txn
RECENT = 1.0  # seconds a copy answers `read(recent=True)`: well within one engine step
P = ParamSpec("P")
R = TypeVar("R")


def _shape_checked(
    method: Callable[Concatenate[EtcdStore, P], R],
) -> Callable[Concatenate[EtcdStore, P], R]:
    @functools.wraps(method)
    def checked(self: EtcdStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise CoordinatorError(
                f"etcd answered a {method.__name__} in a shape medic cannot read ({type(exc).__name__}: "
                f"{str(exc)[:200]}); is {self.describe()} an etcd 3.4+ client URL? No restart until it is"
            ) from None

    return checked


class EtcdStore:
    max_ops = MAX_TXN_OPS

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        prefix: str = "/medic",
        namespace: str = "default",
        timeout: float = 2.0,
        security: EtcdSecurity | None = None,
    ) -> None:
        self.gateway = EtcdGateway(endpoints, timeout, security)
        self.base = f"{prefix}/{namespace}/"
        self._watches: dict[str, KeyWatch] = {}
        self._lock = (
            threading.Lock()
        )  # over the watches and copies: the engine's step and an API request may read at once
        self._copies: dict[str, tuple[Snapshot, float]] = {}  # key -> (its items, read at) for `recent`
        self._commits = 0  # a copy read before this store's last commit is not kept

    def describe(self) -> str:
        return f"etcd coordinator {self.gateway.describe()} (keys {self.base})"

    def close(self) -> None:
        with self._lock:
            watches, self._watches = list(self._watches.values()), {}
        for watch in watches:
            watch.close()
        self.gateway.close()

    def unwatch(self, key: str) -> None:
        with self._lock:
            watch = self._watches.pop(key, None)
        if watch is not None:
            watch.close()

    # ----------------------------------------------------------------------------- the five operations
    @_shape_checked
    def read(self, keys: Sequence[str], *, watch: bool = False, recent: bool = False) -> Snapshot:
        keys = list(dict.fromkeys(keys))
        if watch:
            watched = self._watched(keys)
            if watched is not None:
                return watched
        if recent:
            return self._recent(keys)
        return self._read(keys)

    def _read(self, keys: list[str]) -> Snapshot:
        ops = []
        for key in keys:
            body = {"key": b64(self.base + key)}
            if key.endswith("/"):
                body["range_end"] = prefix_end(self.base + key)
            ops.append({"request_range": body})
        data = self.gateway.call("kv/txn", {"compare": [], "success": ops, "failure": []})
        responses = data["responses"] if ops else []  # one per range, kvs or not: missing is not "none"
        if not isinstance(responses, list) or len(responses) != len(ops):
            raise ValueError(f"{len(ops)} range answers expected, got {str(responses)[:80]!r}")
        items: dict[str, Item] = {}
        for response in responses:
            for raw in response["response_range"].get("kvs", []):
                kv = self.gateway._kv(raw)
                items[kv["key"][len(self.base) :]] = _item(kv)
        return Snapshot(items, answer_revision(data))

    @_shape_checked
    def commit(self, change: Change) -> int | None:
        self._forget_copies()  # what this agent writes, it reads at once
        try:
            return self._commit(change)
        finally:
            self._forget_copies()  # nor is a copy read while the commit was under way kept

    def _commit(self, change: Change) -> int | None:
        gw = self.gateway
        compare = [
            gw.absent(self.base + key) if revision == ABSENT else gw.unchanged(self.base + key, revision)
            for key, revision in change.expect.items()
        ]
        ops = [gw.delete_op(self.base + key) for key in change.deletes]
        ops += [gw.put_op(self.base + key, put.value, put.lease) for key, put in change.puts.items()]
        data = gw.call("kv/txn", {"compare": compare, "success": ops, "failure": []})
        return answer_revision(data) if data.get("succeeded") else None  # omitted when false

    @_shape_checked
    def grant(self, ttl: float) -> int:
        return self.gateway.grant(ttl)[0]

    @_shape_checked
    def keepalive(self, lease: int) -> float:
        return float(self.gateway.keepalive(lease))

    @_shape_checked
    def revoke(self, lease: int) -> None:
        self.gateway.revoke(lease)

    # ----------------------------------------------------------------------------- recent and watched copies
    def _forget_copies(self) -> None:
        with self._lock:
            self._commits += 1
            self._copies.clear()

    def _recent(self, keys: list[str]) -> Snapshot:
        """The keys from copies read within `RECENT` seconds, else all of them in one read."""
        now = time.monotonic()
        with self._lock:
            copies = [self._copies.get(key) for key in keys]
            commits = self._commits
        if all(c is not None and now - c[1] < RECENT for c in copies):
            kept = [c[0] for c in copies if c is not None]
            items = {k: v for snapshot in kept for k, v in snapshot.items.items()}
            return Snapshot(items, min((snapshot.revision for snapshot in kept), default=0))
        snapshot = self._read(keys)
        with self._lock:
            if commits == self._commits:
                for key in keys:
                    under = {
                        k: v
                        for k, v in snapshot.items.items()
                        if k == key or (key.endswith("/") and k.startswith(key))
                    }
                    self._copies[key] = (Snapshot(under, snapshot.revision), now)
        return snapshot

    def _watched(self, keys: list[str]) -> Snapshot | None:
        """The keys from their watched copies (a watch started for each new one), or None while
        one is not current (then the caller reads etcd itself)."""
        copies = []
        for key in keys:
            with self._lock:
                watch = self._watches.get(key)
                if watch is None:
                    watch = KeyWatch(self.gateway, self.base + key, prefix=key.endswith("/"))
                    watch.start()  # reads the range once: unavailable when etcd does not answer
                    self._watches[key] = watch
            wait_fresh(watch, self.gateway.timeout)
            if not watch.fresh:
                return None
            copies.append(watch)
        items = {k[len(self.base) :]: _item(kv) for w in copies for k, kv in w.items().items()}
        return Snapshot(items, min((w.revision for w in copies), default=0))


def _item(kv: dict[str, Any]) -> Item:
    return Item(kv["value"], int(kv["mod_revision"]), int(kv["create_revision"]), int(kv["lease"]))
