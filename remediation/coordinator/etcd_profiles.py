"""Workload profiles in etcd: `profiles/<key>` under the coordinator's namespace, one key per workload.

Each put attaches the key to this agent's profile lease of `ttl` (kept alive by the put itself),
so a workload whose agents all died (or stopped sharing) loses its profile by itself; a peer's put
moves the key to that peer's lease. A read of several keys is one txn of range requests:
one request whatever the number of keys, never a read of the whole prefix, so an agent's cost does
not grow with the fleet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from remediation.coordinator.base import MAX_PROFILE_READ, check_profile_key, profile_doc, profile_text
from remediation.coordinator.etcd_gateway import EtcdGateway, b64

PROFILES = "profiles/"


class ProfileLease:
    """The one lease this agent's profiles hang on: renewed by each put, granted again when gone."""

    def __init__(self) -> None:
        self.lease = 0
        self.ttl = 0.0

    def current(self, gateway: EtcdGateway, ttl: float) -> int:
        """One request: a keepalive of the lease (or a grant when it expired or `ttl` changed)."""
        if self.lease and self.ttl == ttl and gateway.keepalive(self.lease) > 0:
            return self.lease
        self.lease, _ = gateway.grant(ttl)
        self.ttl = ttl
        return self.lease


def put_profile(
    gateway: EtcdGateway, base: str, lease: ProfileLease, key: str, doc: Mapping[str, Any], ttl: float
) -> None:
    """Two requests: the lease's keepalive (or grant) and the put on it."""
    text = profile_text(key, doc)
    gateway.call(
        "kv/put", gateway.put_op(base + PROFILES + key, text, lease.current(gateway, ttl))["request_put"]
    )


def get_profiles(gateway: EtcdGateway, base: str, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """One txn with a range request per key (at most `MAX_PROFILE_READ`); an answer without one
    range answer per key is not etcd's (`ValueError`/`KeyError`: a `CoordinatorError` to the caller),
    never "no profiles"."""
    wanted = list(dict.fromkeys(keys))[:MAX_PROFILE_READ]
    for key in wanted:
        check_profile_key(key)
    if not wanted:
        return {}
    ops = [{"request_range": {"key": b64(base + PROFILES + key)}} for key in wanted]
    data = gateway.call("kv/txn", {"compare": [], "success": ops, "failure": []})
    responses = data["responses"]  # etcd answers one per range, kvs or not: missing is not "none"
    if not isinstance(responses, list) or len(responses) != len(ops):
        raise ValueError(f"{len(ops)} range answers expected, got {str(responses)[:80]!r}")
    out: dict[str, dict[str, Any]] = {}
    for response in responses:
        for kv in response["response_range"].get("kvs", []):
            found = EtcdGateway._kv(kv)
            doc = profile_doc(found["value"])
            key = found["key"][len(base + PROFILES) :]
            if doc is not None and key in wanted:
                out[key] = doc
    return out
