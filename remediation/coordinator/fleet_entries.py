"""What each agent publishes of its instances, as rules over the store: `fleet/<instance>`.

Each entry hangs on its agent's fleet lease and is written only when it changes (`updated_at` aside:
a put is a new revision the store keeps); otherwise the agent only keeps the lease alive, every
third of `fleet_ttl`. An agent that dies stops, and its entries go with the lease.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from remediation.coordinator.records import json_object
from remediation.coordinator.store import Change, Put, Snapshot
from remediation.model import FleetEntry

FLEET = "fleet/"
MAX_ENTRY_BYTES = 16384
Parsed = dict[str, tuple[int, FleetEntry | None]]  # instance -> (revision read, entry or None when bad)


def publish(
    published: Mapping[str, str], entries: Sequence[FleetEntry], lease: int
) -> tuple[Change, dict[str, str]]:
    """The commit that makes `entries` what is published on `lease`, given what was (`published`:
    instance -> its text without `updated_at`); and what is published after it."""
    wanted = {e.instance: json.dumps({**e.to_dict(), "updated_at": None}, sort_keys=True) for e in entries}
    by_name = {e.instance: e for e in entries}
    puts = {
        FLEET + name: Put(json.dumps(by_name[name].to_dict()), lease)
        for name, text in wanted.items()
        if published.get(name) != text
    }
    return Change(puts=puts, deletes=[FLEET + n for n in published if n not in wanted]), wanted


def entries(snapshot: Snapshot, known: Parsed) -> tuple[list[FleetEntry], Parsed]:
    """Every readable entry by instance name, each parsed once per revision (`known`: the last parse)."""
    parsed: Parsed = {}
    for name, item in snapshot.under(FLEET).items():
        seen = known.get(name)
        if seen is not None and seen[0] == item.revision:
            parsed[name] = seen
            continue
        try:
            parsed[name] = (item.revision, FleetEntry.from_dict(json_object(item.value, MAX_ENTRY_BYTES)))
        except ValueError:
            parsed[name] = (item.revision, None)  # another agent's bad entry: skipped; it expires
    return sorted((e for _, e in parsed.values() if e is not None), key=lambda e: e.instance), parsed
