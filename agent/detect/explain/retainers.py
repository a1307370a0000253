"""What holds the suspects: `held_by` on each suspect the JVM could name a holder for.

The `jvm` probe records, when a leak finding opens, JFR's old-object samples with their chains of
references to the GC roots (probes/jvmretainers.py): a `retainer` snapshot with one row per holder
(`static field MapLeak.CACHE`), the container it holds (`java.util.HashMap of 10800 entries`) and the
classes on the chains below it. A class suspect is held by each holder whose chains pass through it,
or through a class folded into it (`carried`): `held_by` lists them as `{what, where, samples}`, the
holder of most samples first.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from agent.detect.explain.suspects import Suspect
from agent.state.histograms import HistogramStore
from agent.state.store import Store

MAX_HOLDERS = 3


def with_held_by(
    store: Store, instance: str, since: float, now: float, suspects: list[Suspect]
) -> list[Suspect]:
    """`suspects` with `held_by` from the newest retainer snapshot of [since, now] (unchanged without one)."""
    if not any(s.kind == "class" for s in suspects):
        return suspects
    found = HistogramStore(store).history(instance, "retainer", since, now, limit=1)
    if not found:
        return suspects
    holders = [
        h for h in (_holder(row.name, row.count, row.detail) for row in found[-1].rows) if h is not None
    ]
    out = []
    for suspect in suspects:
        names = {suspect.name, *suspect.carried}
        held = [
            {"what": what, "where": where, "samples": int(count)}
            for where, count, what, holds in holders
            if suspect.kind == "class" and names & holds
        ]
        out.append(replace(suspect, held_by=tuple(held[:MAX_HOLDERS])) if held else suspect)
    return out


def _holder(where: str, count: float, detail: str | None) -> tuple[str, float, str, set[str]] | None:
    try:
        parsed: Any = json.loads(detail or "")
    except ValueError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("holds"), list):
        return None
    return where, count, str(parsed.get("what") or ""), {str(name) for name in parsed["holds"]}
