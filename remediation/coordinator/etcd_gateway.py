"""A small client for etcd's v3 JSON gateway (etcd 3.4+), over httpx: just what the coordinator needs.

Facts it relies on (verified against etcd 3.4.23, docs/remediation.md): paths under `/v3/`; keys
and values are base64; int64 fields (lease IDs, TTLs, revisions) come back as JSON strings; proto3
JSON omits defaults, so a failed txn has no `succeeded` key and an empty range no `kvs`; the
keepalive endpoint answers one message per request; the minimum lease TTL is 2 s; revoking an
unknown lease is a 404 with gRPC code 5.

Connection failures and timeouts try the next endpoint, then raise `CoordinatorUnavailable`;
an error answer raises `CoordinatorError` with etcd's message.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import httpx

from remediation.errors import CoordinatorError, CoordinatorUnavailable

NOT_FOUND = 5  # gRPC NotFound, e.g. revoking an unknown lease


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def prefix_end(prefix: str) -> str:
    """The `range_end` that covers every key starting with `prefix` (last byte + 1), base64."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return b64("\0")
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


class EtcdGateway:
    def __init__(self, endpoints: Sequence[str], timeout: float) -> None:
        if not endpoints:
            raise CoordinatorError("no etcd endpoints configured (remediation.coordinator.etcd.endpoints)")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), trust_env=False)
        self._preferred = 0

    def close(self) -> None:
        self._client.close()

    def call(self, path: str, body: dict[str, Any], *, missing_ok: bool = False) -> dict[str, Any]:
        """POST `body` to `/v3/<path>` on the first endpoint that answers."""
        problems = []
        count = len(self.endpoints)
        for i in range(count):
            index = (self._preferred + i) % count
            url = f"{self.endpoints[index]}/v3/{path}"
            try:
                response = self._client.post(url, content=json.dumps(body))
            except httpx.TimeoutException:
                problems.append(f"{self.endpoints[index]}: no answer within {self.timeout:g}s")
                continue
            except httpx.HTTPError as exc:
                problems.append(f"{self.endpoints[index]}: {exc.__class__.__name__}: {exc}")
                continue
            self._preferred = index
            return self._decode(response, path, missing_ok)
        raise CoordinatorUnavailable(
            f"etcd unreachable ({'; '.join(problems)}); no restart until it answers: check "
            "remediation.coordinator.etcd.endpoints and that etcd is up"
        )

    @staticmethod
    def _decode(response: httpx.Response, path: str, missing_ok: bool) -> dict[str, Any]:
        try:
            data = response.json()
        except ValueError:
            raise CoordinatorError(
                f"etcd /v3/{path} answered HTTP {response.status_code} with non-JSON: {response.text[:200]!r}; "
                "is this an etcd 3.4+ client URL?"
            ) from None
        if not isinstance(data, dict):
            raise CoordinatorError(f"etcd /v3/{path} answered {type(data).__name__}, expected an object")
        if response.status_code >= 400 or "error" in data:
            if missing_ok and data.get("code") == NOT_FOUND:
                return {}
            message = data.get("message") or data.get("error") or response.text[:200]
            raise CoordinatorError(f"etcd /v3/{path} failed (HTTP {response.status_code}): {message}")
        return data

    # ----------------------------------------------------------------------------- kv
    def range_prefix(self, prefix: str) -> tuple[list[dict[str, Any]], int]:
        """Every kv under `prefix` (key and value decoded), and the revision of the read."""
        data = self.call("kv/range", {"key": b64(prefix), "range_end": prefix_end(prefix)})
        return [self._kv(kv) for kv in data.get("kvs", [])], int(data.get("header", {}).get("revision", 0))

    def get(self, key: str) -> dict[str, Any] | None:
        data = self.call("kv/range", {"key": b64(key)})
        kvs = data.get("kvs", [])
        return self._kv(kvs[0]) if kvs else None

    @staticmethod
    def _kv(kv: dict[str, Any]) -> dict[str, Any]:
        return {
            "key": unb64(kv.get("key", "")),
            "value": unb64(kv.get("value", "")),
            "create_revision": int(kv.get("create_revision", 0)),
            "mod_revision": int(kv.get("mod_revision", 0)),
            "lease": int(kv.get("lease", 0)),
        }

    def txn(self, compare: list[dict], success: list[dict], failure: list[dict] | None = None) -> bool:
        data = self.call("kv/txn", {"compare": compare, "success": success, "failure": failure or []})
        return bool(data.get("succeeded", False))  # omitted when false

    @staticmethod
    def put_op(key: str, value: str, lease: int | None = None, ignore_lease: bool = False) -> dict:
        request: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            request["lease"] = str(lease)
        if ignore_lease:
            request["ignore_lease"] = True
        return {"request_put": request}

    @staticmethod
    def delete_op(key: str) -> dict:
        return {"request_delete_range": {"key": b64(key)}}

    @staticmethod
    def absent(key: str) -> dict:
        return {"target": "CREATE", "key": b64(key), "result": "EQUAL", "create_revision": "0"}

    @staticmethod
    def unchanged(key: str, mod_revision: int) -> dict:
        return {"target": "MOD", "key": b64(key), "result": "EQUAL", "mod_revision": str(mod_revision)}

    # ----------------------------------------------------------------------------- leases
    def grant(self, ttl: float) -> tuple[int, int]:
        data = self.call("lease/grant", {"TTL": str(max(2, round(ttl)))})
        lease, granted = int(data.get("ID", 0)), int(data.get("TTL", 0))
        if not lease:
            raise CoordinatorError(f"etcd granted no lease: {data}")
        return lease, granted

    def keepalive(self, lease: int) -> int:
        """The lease's renewed TTL in seconds; 0 when it no longer exists."""
        data = self.call("lease/keepalive", {"ID": str(lease)})
        return int(data.get("result", {}).get("TTL", 0))

    def revoke(self, lease: int) -> None:
        self.call("lease/revoke", {"ID": str(lease)}, missing_ok=True)
