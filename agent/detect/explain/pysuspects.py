"""Python suspects: what holds what grows, and what a leak finding is waiting for to name it.

`python_order` finishes the ranking of a Python target's suspects (`suspects_for` calls it):

- **held by**: an allocation site is held by a container when the newest entries of that container
  were allocated there (the `holders` of the latest tracemalloc snapshot, `medic_hook.holders`); a
  type is held by a growing container whose contents are of that type (the containers of the latest
  type snapshot). `held_by` says which container, what it holds, and the line that adds to it;
- a container suspect gets that line too (`added_at`); one that holds a site suspect or an
  application's class is shown beside it (`held_by`, with its growth) rather than again on its own
  (one that holds only builtins, `bytes`, stays: it is the name to look for);
- order: allocation sites first (a line to look at), then containers and the application's types,
  then builtin types (`bytes`, `str`, `dict`: the payload of the others).

`unexplained` tells a leak the type view cannot explain (no container or site grows, the types that
grow explain less than half of it): the detection job then asks for allocation sites while the
finding is still pending. `collecting` says on a finding what is being collected and when a suspect
can be expected: the tracing session's snapshots so far against the `snapshots_needed` for a site to
stand out among all those compared, or why the session ended before.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from itertools import pairwise
from typing import Any

from agent.core.histograms import Snapshot
from agent.detect.explain.suspects import Suspect, compared_confidence, current_lifetime
from agent.detect.explain.sustained import MIN_CONFIDENCE, MIN_POINTS
from agent.detect.trend import mann_kendall, normal_cdf
from agent.state.histograms import HistogramStore
from agent.state.store import Store

HOLDER_FIELDS = ("name", "type", "len", "holds", "added_at", "traceback")


def _builtin_type(suspect: Suspect) -> bool:
    return suspect.kind == "type" and "." not in suspect.name


def _latest(histos: HistogramStore, instance: str, kind: str, since: float, now: float) -> Snapshot | None:
    found = current_lifetime(histos.history(instance, kind, since, now, limit=1))
    return found[-1] if found else None


def python_order(
    found: list[Suspect], histos: HistogramStore, instance: str, since: float, now: float
) -> list[Suspect]:
    """`found` (ranked) with what holds each Python suspect, holders folded into their sites, and
    sites first, builtin types last."""
    if not any(s.source in ("python", "containers", "tracemalloc") for s in found):
        return found
    wanted = any(s.kind in ("site", "container") for s in found)
    sites = _latest(histos, instance, "site", since, now) if wanted else None
    holders = [h for h in (sites.meta.get("holders") or []) if isinstance(h, dict)] if sites else []
    types = _latest(histos, instance, "type", since, now)
    contents = {
        c.get("name"): c
        for c in ((types.meta.get("containers") or []) if types else [])
        if isinstance(c, dict)
    }
    growing = {s.name: s for s in found if s.kind == "container"}
    out, folded = [], set()
    for suspect in found:
        if suspect.kind == "container":
            holder = next((h for h in holders if h.get("name") == suspect.name), None)
            if holder is not None and holder.get("added_at"):
                suspect = replace(suspect, added_at=str(holder["added_at"]))
        elif suspect.kind == "site":
            holder = _holding_site(suspect.name, holders, growing)
            if holder is not None:
                folded.add(holder["name"])
                suspect = replace(suspect, held_by=(_held_by(holder, growing.get(holder["name"])),))
        elif suspect.kind == "type":
            container = _holding_type(suspect.name, contents, growing)
            if container is not None:
                holder = next((h for h in holders if h.get("name") == container.name), None)
                if not _builtin_type(suspect):  # an application's class: shown with what holds it
                    folded.add(container.name)
                suspect = replace(suspect, held_by=(_held_by(holder or {"name": container.name}, container),))
        out.append(suspect)
    out = [s for s in out if not (s.kind == "container" and s.name in folded)]
    return (
        [s for s in out if s.kind == "site"]
        + [s for s in out if s.kind != "site" and not _builtin_type(s)]
        + [s for s in out if _builtin_type(s)]
    )


def _holding_site(
    site: str, holders: list[dict[str, Any]], growing: dict[str, Suspect]
) -> dict[str, Any] | None:
    """The holder whose newest entries were allocated at `site`; a growing container first."""
    holding = [h for h in holders if isinstance(h.get("name"), str) and site in (h.get("sites") or [])]
    holding.sort(
        key=lambda h: (
            h["name"] not in growing,
            -(growing[h["name"]].bytes_per_second if h["name"] in growing else 0),
        )
    )
    return holding[0] if holding else None


def _holding_type(
    kind: str, contents: dict[Any, dict[str, Any]], growing: dict[str, Suspect]
) -> Suspect | None:
    """The fastest growing container suspect whose contents are of type `kind`."""
    holding = [
        suspect
        for name, suspect in growing.items()
        if any(kind in shape.split(" -> ") for shape in (contents.get(name) or {}).get("kinds") or [])
    ]
    return max(holding, key=lambda s: s.bytes_per_second, default=None)


def _held_by(holder: dict[str, Any], container: Suspect | None) -> dict[str, Any]:
    """A holder record as every suspect's `held_by` has them: `where` (the container, named where it
    lives) and `what` (its type, length and what it holds), with the line that adds to it."""
    held = {key: holder.get(key) for key in HOLDER_FIELDS}
    if container is not None:
        held["bytes_per_second"] = container.bytes_per_second
        held["count_per_second"] = container.count_per_second
        held["holds"] = held["holds"] or container.detail
    length = f"of {held['len']}" if isinstance(held.get("len"), int) else None
    what = " ".join(str(part) for part in (held.get("type"), length, held.get("holds")) if part)
    return {"where": held["name"], "what": what or None, **held}


def snapshots_needed(compared: int, min_confidence: float = MIN_CONFIDENCE) -> int:
    """The fewest snapshots of an unbroken rise that pass `compared_confidence` with `compared` names
    (8 for 50 names at the defaults): when a suspect can be expected at the earliest."""
    required = compared_confidence(min_confidence, compared)
    n = MIN_POINTS
    while n < 100 and normal_cdf(mann_kendall([float(i) for i in range(n)])[1]) < required:
        n += 1
    return n


def python_target(store: Store, instance: str, since: float, now: float) -> bool:
    """Whether `instance` is a Python target with the hook (it has type histograms)."""
    return bool(HistogramStore(store).snapshots(instance, since, now, "type", limit=1))


def unexplained(suspects: list[dict[str, Any]]) -> bool:
    """Whether the type view leaves a leak unexplained: no container and no site grows, and the types
    that grow explain less than half of the growth."""
    if any(s.get("kind") in ("container", "site") for s in suspects):
        return False
    return sum(s.get("share") or 0.0 for s in suspects if s.get("kind") == "type") < 0.5


def collecting(
    store: Store,
    instance: str,
    since: float,
    now: float,
    suspects: list[dict[str, Any]],
    requested: bool,
    lifetime: float | None = None,
) -> dict[str, Any] | None:
    """What a leak finding on a Python target waits for: the allocation-site session's snapshots in
    [since, now] and when a site suspect can be expected (`expected_at`), or why the session ended
    (since `lifetime`, the process's start); None when a site suspect is there already, the target has
    no Python hook, or no session was `requested`."""
    if any(s.get("kind") == "site" for s in suspects):
        return None
    if not python_target(store, instance, since, now):
        return None
    histos = HistogramStore(store)
    session = current_lifetime(histos.snapshots(instance, since, now, "site", "tracemalloc", limit=500))
    stopped = _stopped(store, instance, session[0].ts if session else min(since, lifetime or since))
    what = "allocation sites (tracemalloc)"
    if not session:
        if stopped:
            return {"what": what, "state": "stopped", "message": f"tracing ended: {stopped['message']}"}
        if not requested:
            return None
        return {
            "what": what,
            "state": "requested",
            "message": "tracing starts at the next run of the pyhist probe",
        }
    times = [s.ts for s in session]
    compared = max(1, min(int(session[-1].rows_total or 1), 50))
    needed = snapshots_needed(compared)
    spacing = statistics.median(b - a for a, b in pairwise(times)) if len(times) > 1 else None
    expected = None
    if not stopped and spacing is not None:
        expected = times[-1] + max(0, needed - len(times)) * spacing
    message = f"{len(times)} of the {needed} snapshots a site suspect needs"
    if stopped:
        message += f"; tracing ended: {stopped['message']}"
    return {
        "what": what,
        "state": "stopped" if stopped else "tracing",
        "since": times[0],
        "snapshots": len(times),
        "needed": needed,
        "interval_s": spacing,
        "expected_at": expected,
        "stopped": None if not stopped else {k: stopped.get(k) for k in ("reason", "setting", "ts")},
        "message": message,
    }


def _stopped(store: Store, instance: str, since: float) -> dict[str, Any] | None:
    """The last `sites_stopped` event of `instance` since `since`, if the session ended."""
    found = store.events(since=since, instance=instance, kinds=["sites_stopped", "sites_started"], limit=1)
    if not found or found[0].kind != "sites_stopped":
        return None
    event = found[0]
    return {"message": event.message, "ts": event.ts, **event.data}
