"""Workload profiles, as rules over the store: `profiles/<key>`, one key per workload.

Each put attaches the key to this agent's profile lease of `ttl` (kept alive by the put itself), so
a workload whose agents all died (or stopped sharing) loses its profile by itself; a peer's put moves
the key to that peer's lease. A read of several keys is one read of exact keys (on etcd one txn,
whatever their number), never of the whole prefix, so an agent's cost does not grow with the fleet.
The coordinator keeps them as opaque JSON objects (bounded in size); what they mean is the
detectors' business (`agent.detect.memory.priors`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from remediation.coordinator.records import json_object
from remediation.coordinator.store import Change, Put, Snapshot
from remediation.errors import CoordinatorError

PROFILES = "profiles/"
MAX_PROFILE_BYTES = 4096  # a workload profile as JSON (they are under 2 KiB): more is refused
MAX_PROFILE_KEY = 200  # characters of a workload key
MAX_PROFILE_READ = 64  # keys one get_profiles call reads


def profile_text(key: str, doc: Mapping[str, Any]) -> str:
    """`doc` as the JSON text kept under `key`; `CoordinatorError` when either is out of bounds
    (a key that is no path segment, a doc that is no JSON object or over `MAX_PROFILE_BYTES`)."""
    check_profile_key(key)
    if not isinstance(doc, Mapping):
        raise CoordinatorError(f"the profile of {key!r} must be a JSON object")
    try:
        text = json.dumps(dict(doc), sort_keys=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise CoordinatorError(f"the profile of {key!r} is not JSON: {exc}") from None
    if len(text.encode()) > MAX_PROFILE_BYTES:
        raise CoordinatorError(
            f"the profile of {key!r} is {len(text.encode())} bytes as JSON, over {MAX_PROFILE_BYTES}: not shared"
        )
    return text


def check_profile_key(key: str) -> None:
    """A workload key is one non-empty path segment of printable characters."""
    if (
        not isinstance(key, str)
        or not key
        or len(key) > MAX_PROFILE_KEY
        or "/" in key
        or not key.isprintable()
    ):
        raise CoordinatorError(
            f"bad workload key {key!r}: 1 to {MAX_PROFILE_KEY} printable characters, no '/'"
        )


def profile_doc(text: str) -> dict[str, Any] | None:
    """What a peer wrote, or None when it is no JSON object within the bound (skipped, never raised)."""
    return json_object(text, MAX_PROFILE_BYTES)


def wanted_keys(keys: Sequence[str]) -> list[str]:
    """The store keys of the first `MAX_PROFILE_READ` distinct workload keys (each checked)."""
    wanted = list(dict.fromkeys(keys))[:MAX_PROFILE_READ]
    for key in wanted:
        check_profile_key(key)
    return [PROFILES + key for key in wanted]


def profiles_in(snapshot: Snapshot) -> dict[str, dict[str, Any]]:
    """The readable profiles of a snapshot, by workload key."""
    return {
        key: doc
        for key, item in snapshot.under(PROFILES).items()
        if (doc := profile_doc(item.value)) is not None
    }


def put(key: str, doc: Mapping[str, Any], lease: int) -> Change:
    return Change(puts={PROFILES + key: Put(profile_text(key, doc), lease)})
