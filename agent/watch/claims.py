"""Which instance each process belongs to: one watcher per process, and the workers of each server.

The rules, applied at every reconcile (the tracker calls them):

- A process is watched by one instance. Two specs that name the same pid, pidfile or regex are
  refused when the config loads; an overlap seen only at run time (a `pid` spec and a `cmdline`
  spec that both find one process) is an `instance_overlap` event: the instance that watches the
  process already keeps it (at once: the one listed first), the other is not pointed at it.
- An instance brings its process's descendants (`match.children`, on by default): its workers. A
  process that another instance matches itself stays that instance's, with everything below it,
  and is left out of the tree above it (one `instance_overlap` event says so).
- With `children`, a `cmdline` match below another match of the same regex is a worker of that
  one, not a server of its own (gunicorn's workers carry their master's command line).
- When a server goes away, its workers that still run `ORPHAN_GRACE` later are orphans: one
  `instance_orphans` event, and no `cmdline` instance adopts them as its server (a restart would
  otherwise stop one worker alone). They are forgotten once they exit.
- At most `match.max_children` descendants are followed, nearest first; one `instance_tree_capped`
  event per streak says how many were left out (as `instance_cap_reached` does for `select: all`
  matches beyond `match.max_instances`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from agent.config.model import InstanceSpec
from agent.core.errors import ProbeError
from agent.core.records import ProcessIdentity
from agent.state.eventlog import EventLog
from agent.watch.discovery import by_pid
from agent.watch.instances import InstanceState
from agent.watch.tree import Member
from probes.linux.procfs import HOST_ROOT, same_process
from probes.linux.proctree import ProcessTable, describe, read_process_table

log = logging.getLogger("medic.claims")
ORPHAN_GRACE = 10.0  # seconds a server's workers may take to exit after it before they count as orphans


class Claims:
    def __init__(self, events: EventLog, root: Path = HOST_ROOT) -> None:
        self.events = events
        self.root = root
        self._table: ProcessTable | None = None
        self._reported: set[tuple[str, int, str]] = set()  # (instance, pid, other): overlaps already said
        self._capped: set[tuple[str, str]] = set()  # bounds exceeded and reported: (which, instance)
        # workers left by a server that went away: identity -> (instance, when it went away, reported)
        self.orphans: dict[ProcessIdentity, tuple[str, float, bool]] = {}

    # ------------------------------------------------------------------------------ the process table
    def begin(self) -> None:
        """A new reconcile: the table is read again when first needed."""
        self._table = None

    def table(self) -> ProcessTable | None:
        if self._table is None:
            try:
                self._table = read_process_table(self.root)
            except ProbeError as exc:
                log.warning("cannot read the process table: %s", exc)
                return None
        return self._table

    # ------------------------------------------------------------------------------ one watcher
    def owner(
        self, state: InstanceState | None, identity: ProcessIdentity, states: Iterable[InstanceState]
    ) -> str | None:
        """The instance other than `state` that watches `identity` as its own process already, if any."""
        for other in states:
            if (
                other is not state
                and other.status == "up"
                and other.pid == identity.pid
                and other.start_time is not None
                and same_process(other.start_time, identity.start_time)
            ):
                return other.name
        return None

    def refuse(self, instance: str, owner: str, identity: ProcessIdentity) -> str:
        """Why `instance` is not pointed at `identity`; one event per (instance, pid, owner)."""
        reason = f"pid {identity.pid} is watched by instance {owner!r} already"
        self._overlap(
            instance,
            identity.pid,
            owner,
            f"{reason}: this instance does not watch it too (no second probe, no second restart); "
            f"narrow its match or remove one of the two",
        )
        return reason

    def candidates(
        self, spec: InstanceSpec, matches: list[ProcessIdentity], states: Mapping[str, InstanceState]
    ) -> list[ProcessIdentity]:
        """The `cmdline` matches that may be this spec's server: none of its own instances' workers
        (also when their server has just gone: they are orphans, not its successor), no orphan, and
        with `children` no process below another match (a worker of that one). A worker of another
        instance that this spec matches is this spec's: its match is explicit (`refresh` says so)."""
        workers = {w for s in states.values() if s.spec is spec or s.status != "up" for w in s.tree.workers}
        kept = [m for m in matches if m not in self.orphans and m not in workers]
        if not spec.match.children or len(kept) < 2:
            return kept
        table = self.table()
        if table is None:
            return kept
        pids = {m.pid for m in kept}
        return [m for m in kept if not pids.intersection(table.ancestors(m.pid))]

    # ------------------------------------------------------------------------------ trees
    def refresh(self, states: Mapping[str, InstanceState], now: float, full: bool = True) -> None:
        """Bring each up instance's workers up to date (and forget orphans that exited).

        The pass over the process table costs about 12 µs per process on the machine: it is made at
        every `full` reconcile (the discovery job's), and on the others only when a server is new or
        one of its workers is gone (one `stat` read per worker tells)."""
        up = [s for s in states.values() if s.status == "up" and s.pid is not None]
        trees = [s for s in up if s.spec.match.children]
        if not trees and not self.orphans:
            return
        if not full and not any(_stale(s) for s in trees):
            return
        table = self.table()
        if table is None:
            return
        self._orphans(table, now)
        servers = {s.pid: s for s in up if s.pid is not None}
        skip = {*servers, os.getpid()}  # medic itself is never a worker (its children are instances)
        for state in trees:
            if state.pid is None:
                continue
            met: list[int] = []
            found, beyond = table.descendants(state.pid, state.spec.match.max_children, skip, met)
            for pid in met:
                other = servers.get(pid)
                if other is None:
                    continue
                self._overlap(
                    other.name,
                    pid,
                    state.name,
                    f"pid {pid} runs below instance {state.name!r}'s process but is watched as "
                    f"{other.name!r}: it stays {other.name!r}'s alone, and {state.name!r}'s tree leaves it out",
                )
            state.tree.refreshed = True
            started, ended = state.tree.update(
                ((e.identity, e.ppid, e) for e in found),
                now,
                lambda entry: describe(entry.pid, entry.comm, self.root),
            )
            self._changed(state, started, ended, now)
            self._cap(state, beyond)

    def leave(self, state: InstanceState, now: float) -> None:
        """The instance's server went away: its workers are watched for `ORPHAN_GRACE`, then reported."""
        for identity in state.tree.workers:
            self.orphans[identity] = (state.name, now, False)

    def _orphans(self, table: ProcessTable, now: float) -> None:
        for identity, (name, since, reported) in list(self.orphans.items()):
            if not table.alive(identity):
                del self.orphans[identity]
            elif not reported and now - since >= ORPHAN_GRACE:
                self.orphans[identity] = (name, since, True)
                self.events.emit(
                    "instance_orphans",
                    f"worker pid {identity.pid} still runs {now - since:.0f}s after its server went away: "
                    "medic does not adopt, probe or restart it; stop it or restart the service as a whole",
                    instance=name,
                    severity="warning",
                    pid=identity.pid,
                    start_time=identity.start_time,
                )

    def _changed(self, state: InstanceState, started: list[Member], ended: list[Member], now: float) -> None:
        if not started and not ended:
            return
        state.tree.worker_restarts += len(ended)
        parts = [
            f"worker pid {m.identity.pid} exited after {now - m.identity.start_time:.0f}s" for m in ended
        ]
        parts += [f"worker pid {m.identity.pid} started ({m.command})" for m in started]
        self.events.emit(
            "instance_workers_changed",
            "; ".join(parts[:8])
            + (f"; and {len(parts) - 8} more" if len(parts) > 8 else "")
            + f": {len(state.tree.workers)} worker(s) now (the server, pid {state.pid}, runs on)",
            instance=state.name,
            started=[m.identity.pid for m in started][:64],
            ended=[m.identity.pid for m in ended][:64],
            workers=len(state.tree.workers),
        )

    def report_cap(self, spec: InstanceSpec, cap: int, beyond: int) -> None:
        """`select: all` matches beyond `max_instances`: one event per streak."""
        self._streak(
            ("instances", spec.name),
            beyond,
            "instance_cap_reached",
            f"{beyond} more process(es) match {spec.match.cmdline!r} beyond match.max_instances={cap}; "
            "they are not followed: narrow the regex or raise max_instances",
            spec.name,
            max_instances=cap,
        )

    def _cap(self, state: InstanceState, beyond: int) -> None:
        state.tree.capped = beyond
        limit = state.spec.match.max_children
        self._streak(
            ("children", state.name),
            beyond,
            "instance_tree_capped",
            f"{beyond} more descendant process(es) of pid {state.pid} beyond match.max_children={limit} "
            "are not followed (their memory is not in the instance's figures, unless its cgroup's is): "
            "raise max_children if they are workers",
            state.name,
            max_children=limit,
        )

    def _streak(
        self, key: tuple[str, str], beyond: int, kind: str, message: str, instance: str, **data: int
    ) -> None:
        """One event when processes go beyond a bound (not one per reconcile); again after it cleared."""
        if not beyond:
            self._capped.discard(key)
            return
        if key in self._capped:
            return
        self._capped.add(key)
        self.events.emit(kind, message, instance=instance, severity="warning", **data, not_followed=beyond)

    def _overlap(self, instance: str, pid: int, other: str, message: str) -> None:
        key = (instance, pid, other)
        if key in self._reported:
            return
        if len(self._reported) >= 4096:  # pids are reused: an old overlap may be said again, never unbounded
            self._reported.clear()
        self._reported.add(key)
        self.events.emit(
            "instance_overlap", message, instance=instance, severity="warning", pid=pid, other=other
        )


def _stale(state: InstanceState) -> bool:
    """Whether the instance's workers must be looked for again: a new server, or a worker that is gone."""
    if not state.tree.refreshed:
        return True
    for identity in state.tree.workers:
        found = by_pid(identity.pid)
        if found is None or not same_process(found.start_time, identity.start_time):
            return True
    return False
