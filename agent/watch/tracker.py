"""Keeps each configured instance attached to its live process.

Each reconcile compares what discovery finds with what the instance followed before, and
records what changed as events: discovered, restarted (a new pid or start time behind the
same instance), down (the process vanished), exited (a managed command ended). A restart
is an event of the same instance, never a new instance. Managed commands are launched and,
when they end, relaunched here (what a launch, an exit or a hold does to the instance is in
agent/watch/launches.py).

A process is the instance only while its identity holds: pid and start time. Whether a new process
behind a `pid` or `pidfile` instance is its restart, or an unrelated process that got a reused pid
(the instance is then down, `not-the-instance`, and the newcomer left alone), is decided by the rules
in agent/watch/adoption.py. Adopted identities live in `identities.json` (agent/state/identities.py),
so the rules hold across agent restarts, and after an agent crash the managed children that outlived
it are adopted, not launched twice.

Every process of every instance is kept in the `process_runs` table (started, ended, exit status):
the supervisor's own record for managed commands (each launch, also one that dies before a reconcile
sees it), the tracker's for the others. Crash loops are judged from it (`runs`). Relaunches of a
managed instance can be held (`hold_relaunch`) while a person is asked to look.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from agent.config.model import InstanceSpec
from agent.core.errors import ProbeError
from agent.core.records import ProbeTarget, ProcessIdentity
from agent.state.eventlog import EventLog
from agent.state.identities import AdoptedProcess, IdentityLedger, PidfileStamp, pidfile_stamp
from agent.state.store import InstanceRecord, Store
from agent.watch import discovery, launches
from agent.watch.adoption import Adoption, is_process
from agent.watch.claims import Claims
from agent.watch.instances import InstanceState
from agent.watch.runs import ProcessRuns
from agent.watch.supervisor import ManagedProcess, Run
from probes.linux.cgroupfiles import cgroup_memory_limit
from probes.linux.procfs import host_memory_total, same_process
from probes.linux.proctree import describe

log = logging.getLogger("medic.tracker")


class Tracker:
    def __init__(
        self,
        specs: list[InstanceSpec],
        store: Store,
        events: EventLog,
        *,
        inherit_output: Collection[str] = (),
    ) -> None:
        """`inherit_output`: managed instances whose output stays medic's (`medic run -- CMD`); the
        others write to `<state_dir>/logs/<instance>.log`."""
        self.specs = specs
        self.store = store
        self.events = events
        self.lock = threading.RLock()
        self.states: dict[str, InstanceState] = {}
        self.managed: dict[str, ManagedProcess] = {}
        self.known: dict[str, InstanceRecord] = store.known_instances()
        self._last_errors: dict[str, str] = {}
        self.forget_hooks: list[Callable[[ProbeTarget], None]] = []  # run when a process is left behind
        self.ledger = IdentityLedger(store.dir)
        self.adoption = Adoption(self.ledger, events)
        self._children_checked = False
        self.claims = Claims(events)  # one watcher per process; each server's workers
        for spec in specs:
            if spec.match.select == "all" and spec.match.cmdline is not None:
                continue  # slots are created as matches appear
            self.states[spec.name] = InstanceState(spec.name, spec)
            if spec.match.managed:
                self.managed[spec.name] = ManagedProcess(
                    name=spec.name,
                    argv=list(spec.match.command or []),
                    cwd=spec.match.cwd,
                    env=dict(spec.match.env),
                    restart_on_exit=spec.restart_on_exit,
                    stop_timeout=spec.stop_timeout,
                    log_path=None if spec.name in inherit_output else self.log_path(spec.name),
                )
        self.process_runs = ProcessRuns(store)

    # ------------------------------------------------------------------------------ queries
    def up_targets(self) -> list[tuple[InstanceState, ProbeTarget]]:
        with self.lock:
            return [
                (s, ProbeTarget(s.name, s.pid, s.start_time, s.labels, s.settings, s.tree.workers))
                for s in self.states.values()
                if s.status == "up" and s.pid is not None and s.start_time is not None
            ]

    def snapshot(self, now: float | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [s.to_dict(now) for s in sorted(self.states.values(), key=lambda s: s.name)]

    def get(self, name: str) -> InstanceState | None:
        with self.lock:
            return self.states.get(name)

    def log_path(self, name: str) -> Path:
        """Where a managed instance's stdout and stderr go."""
        return Path(self.store.dir) / "logs" / f"{name}.log"

    def runs(self, name: str, since: float) -> list[Run]:
        """The instance's processes started since `since`, oldest first (crash loops are judged on them)."""
        return self.process_runs.since(name, since)

    # ------------------------------------------------------------------------------ relaunch holds
    def hold_relaunch(self, name: str, reason: str) -> bool:
        """Stop relaunching a managed instance (its running process is left alone); True when newly held."""
        with self.lock:
            managed = self.managed.get(name)
            if managed is None:
                return False
            return launches.hold_relaunch(name, managed, self.states.get(name), reason, self.events)

    def release_relaunch(self, name: str, why: str) -> bool:
        """Relaunch a held managed instance again as configured; True when it was held."""
        with self.lock:
            managed = self.managed.get(name)
            return managed is not None and launches.release_relaunch(name, managed, why, self.events)

    def held(self) -> dict[str, str]:
        with self.lock:
            return {name: m.held for name, m in self.managed.items() if m.held is not None}

    # ------------------------------------------------------------------------------ managed
    def launch_managed(self, now: float) -> None:
        """Launch every managed command, except those whose child from an earlier agent still runs."""
        with self.lock:
            if not self._children_checked:
                self._children_checked = True
                self.adoption.earlier_children(
                    self.managed, self.states, lambda state, record: self._adopted(state, record, now)
                )
            for name, managed in self.managed.items():
                never_started = managed.proc is None and not managed.adopted and not managed.ended
                if (never_started and managed.held is None) or managed.due_for_relaunch(now):
                    launches.launch(self.states[name], managed, self.events, now)
                self.process_runs.record(name, managed.take_runs(), managed=True)

    def _adopted(self, state: InstanceState, record: AdoptedProcess, now: float) -> None:
        known = self.known.pop(state.name, None)
        if known is not None:
            state.restarts = known.restarts
        self.events.emit(
            "instance_adopted",
            f"pid {record.pid}, launched by an earlier medic, still runs: watching it instead of "
            "launching a copy",
            instance=state.name,
            pid=record.pid,
            start_time=record.start_time,
        )
        state.adopted = record
        self._attach(state, ProcessIdentity(record.pid, record.start_time), now)

    def restart_managed(self, name: str, timeout: float, reason: str = "restarted by medic") -> int:
        """Restart a managed instance's command; the next reconcile records the new pid as a restart."""
        managed = self.managed.get(name)
        if managed is None:
            raise KeyError(f"{name} is not a managed instance (it has no `command:`)")
        pid = managed.restart(timeout)
        self.reconcile()  # records the new child (and its identity) at once
        return pid

    def stop_managed(self) -> dict[str, int | None]:
        """Stop every managed child in parallel (TERM, then KILL after its stop_timeout)."""
        results = launches.stop_all(self.managed)
        with self.lock:
            self.ledger.drop(*self.managed)
            for name, managed in self.managed.items():
                self.process_runs.record(name, managed.take_runs(), managed=True)
        return results

    # ------------------------------------------------------------------------------ reconcile
    def reconcile(self, now: float | None = None, *, scan: bool = False) -> None:
        """Bring every instance up to date with the processes that exist now.

        `scan` also searches all processes for `cmdline` instances (costs a few ms); without it,
        only the followed processes are checked (microseconds each).
        """
        now = time.time() if now is None else now
        with self.lock:
            self.claims.begin()
            for spec in self.specs:
                try:
                    if spec.match.managed:
                        self._reconcile_managed(self.states[spec.name], now)
                    elif spec.match.pid is not None:
                        self._follow(self.states[spec.name], discovery.by_pid(spec.match.pid), now)
                    elif spec.match.pidfile is not None:
                        self._reconcile_pidfile(self.states[spec.name], spec, now)
                    elif spec.match.select == "all":
                        self._reconcile_all(spec, now, scan)
                    else:
                        self._reconcile_newest(self.states[spec.name], spec, now, scan)
                except Exception as exc:  # a bad instance must never stop the others
                    message = f"cannot update: {exc}"
                    if self._last_errors.get(spec.name) != message:  # one event per distinct error
                        log.exception("reconcile of %s failed", spec.name)
                        self.events.emit("reconcile_error", message, instance=spec.name, severity="error")
                    self._last_errors[spec.name] = message
                else:
                    self._last_errors.pop(spec.name, None)
            try:
                self.claims.refresh(self.states, now, full=scan)
            except Exception:  # the workers are extra figures: the servers stay watched whatever happens here
                log.exception("refreshing the instances' workers failed")

    def _reconcile_managed(self, state: InstanceState, now: float) -> None:
        managed = self.managed[state.name]
        end = managed.poll_exit()
        managed.bound_log()
        if end is not None:
            self._leave(state)
            self.ledger.drop(state.name)
            launches.record_exit(state, managed, end, self.events)
        if managed.due_for_relaunch(now):
            launches.launch(state, managed, self.events, now)
        self.process_runs.record(state.name, managed.take_runs(), managed=True)
        pid = managed.pid
        if pid is not None and pid != state.pid:
            self._follow(state, discovery.by_pid(pid), now, "relaunched by medic")
        elif pid is not None:
            self._follow(state, discovery.by_pid(pid), now)

    def _reconcile_pidfile(self, state: InstanceState, spec: InstanceSpec, now: float) -> None:
        assert spec.match.pidfile is not None
        before = pidfile_stamp(spec.match.pidfile)
        identity, why = discovery.by_pidfile(spec.match.pidfile)
        stamp = pidfile_stamp(spec.match.pidfile)
        if identity is not None and stamp != before:
            return  # rewritten while it was read: which pid goes with which stamp is read next time
        self._follow(state, identity, now, why, stamp=stamp)

    def _reconcile_newest(self, state: InstanceState, spec: InstanceSpec, now: float, scan: bool) -> None:
        current = self._alive(state)
        if current is not None:
            self._follow(state, current, now)
            return
        if scan or state.status == "up":  # just vanished: look for its successor at once
            matches = self.claims.candidates(
                spec, discovery.by_cmdline(spec.match.cmdline or ""), self.states
            )
            self._follow(state, matches[-1] if matches else None, now, "no process matches the cmdline regex")

    def _reconcile_all(self, spec: InstanceSpec, now: float, scan: bool) -> None:
        slots = sorted(
            (s for s in self.states.values() if s.spec is spec),
            key=lambda s: s.slot if s.slot is not None else 0,
        )
        alive = {}
        for state in slots:
            identity = self._alive(state)
            if identity is None and state.status == "up":
                self._follow(state, None, now)
                scan = True
            elif identity is not None:
                alive[identity] = state
        if not scan:
            return
        cap, beyond = spec.match.max_instances, 0
        for identity in self.claims.candidates(
            spec, discovery.by_cmdline(spec.match.cmdline or ""), self.states
        ):
            if identity in alive:
                continue
            owner = self.claims.owner(None, identity, self.states.values())
            if owner is not None:
                self.claims.refuse(spec.name, owner, identity)
                continue
            if len(alive) >= cap:
                beyond += 1
                continue
            free = [s for s in slots if s.status != "up"]
            if free:
                state = free[0]
            else:
                index = len(slots)
                state = InstanceState(f"{spec.name}-{index}", spec, slot=index)
                self.states[state.name] = state
                slots.append(state)
            self._follow(state, identity, now)
            alive[identity] = state
        self.claims.report_cap(spec, cap, beyond)

    def _alive(self, state: InstanceState) -> ProcessIdentity | None:
        """The followed process if it still runs as the same process (pid not reused)."""
        if state.pid is None or state.start_time is None:
            return None
        identity = discovery.by_pid(state.pid)
        return identity if identity and same_process(identity.start_time, state.start_time) else None

    # ------------------------------------------------------------------------------ transitions
    def _follow(
        self,
        state: InstanceState,
        identity: ProcessIdentity | None,
        now: float,
        why: str | None = None,
        *,
        stamp: PidfileStamp | None = None,
    ) -> None:
        """Point the instance at `identity` (None: no process), recording what changed. `stamp`: the
        pidfile as it named `identity` (`pidfile` instances)."""
        if identity is None:
            if state.refused is not None:  # the unrelated process went away: nothing is refused any more
                gone = self.adoption.clear_refusal(state)
                if state.status == "down":
                    state.status_reason = f"pid {gone}, not the instance, is gone" + (
                        f"; {why}" if why else ""
                    )
            if state.status == "up":
                self.events.emit(
                    "instance_down",
                    f"pid {state.pid} is gone" + (f"; {why}" if why else ""),
                    instance=state.name,
                    severity="warning",
                    pid=state.pid,
                )
                self._leave(state)
                state.status, state.status_reason = "down", f"pid {state.pid} is gone"
            elif state.status == "waiting" and why:
                state.status_reason = why
            return
        same = (
            state.pid == identity.pid
            and state.start_time is not None
            and same_process(identity.start_time, state.start_time)  # one clock tick, no more
        )
        if same and state.status == "up":
            self.adoption.restamp(state, identity, stamp)
            return
        owner = self.claims.owner(state, identity, self.states.values())
        if owner is not None:  # another instance watches it: never probed or restarted twice
            self._follow(state, None, now, self.claims.refuse(state.name, owner, identity))
            return
        if self.adoption.already_refused(state, identity, stamp):
            return  # an unrelated process at the instance's pid, already reported
        reference = self.adoption.reference(state)
        if reference is not None and not is_process(reference, identity):
            ok, detail = self.adoption.successor(state, reference, identity, stamp)
            if not ok:
                reason = self.adoption.refuse(state, reference, identity, detail, stamp)
                if state.status == "up":
                    self._leave(state)
                state.status, state.status_reason = "down", reason
                return
        self.adoption.clear_refusal(state)
        previous = state.pid
        known = self.known.pop(state.name, None)
        if previous is None and known is not None and known.pid is not None:
            if known.pid == identity.pid and same_process(known.start_time or 0, identity.start_time):
                self.events.emit(
                    "instance_resumed",
                    f"watching pid {identity.pid} again",
                    instance=state.name,
                    pid=identity.pid,
                )
                state.restarts = known.restarts
            else:
                self._count_restart(state, known.restarts)
                self.events.emit(
                    "instance_restarted",
                    f"restarted while medic was not watching: pid {known.pid} → {identity.pid}",
                    instance=state.name,
                    severity="warning",
                    old_pid=known.pid,
                    pid=identity.pid,
                    restarts=state.restarts,
                )
        elif previous is None and state.restarts == 0 and state.status == "waiting":
            if known is not None:
                state.restarts = known.restarts
            self.events.emit(
                "instance_discovered", f"watching pid {identity.pid}", instance=state.name, pid=identity.pid
            )
        else:
            self._count_restart(state, state.restarts)
            self.events.emit(
                "instance_restarted",
                f"restarted: pid {previous} → {identity.pid}" + (f" ({why})" if why else ""),
                instance=state.name,
                severity="warning",
                old_pid=previous,
                pid=identity.pid,
                restarts=state.restarts,
            )
        self._attach(state, identity, now, stamp)

    def _attach(
        self, state: InstanceState, identity: ProcessIdentity, now: float, stamp: PidfileStamp | None = None
    ) -> None:
        """Follow `identity` from now on, and remember what it runs (identities.json)."""
        if not state.spec.match.managed:  # managed: the supervisor recorded the launch itself
            self.process_runs.end(state.name, now, keep=(identity.pid, identity.start_time))
            self.process_runs.record(state.name, [Run(identity.pid, identity.start_time)], managed=False)
        state.pid, state.start_time = identity.pid, identity.start_time
        state.status, state.status_reason, state.exit_code = "up", "running", None
        state.reset_process()
        state.tree.reset(identity, describe(identity.pid), now)
        self.adoption.remember(state, identity, stamp)
        self.resolve_memory_limit(state)
        self.store.remember_instance(state.name, identity.pid, identity.start_time, now)

    def _count_restart(self, state: InstanceState, before: int) -> None:
        state.restarts = before + 1
        self.store.count_restart(state.name)

    def _leave(self, state: InstanceState) -> None:
        """Forget the process the instance followed (caches of probes included)."""
        if not state.spec.match.managed and state.pid is not None:
            self.process_runs.end(state.name, time.time())
        if state.pid is not None and state.start_time is not None:
            target = ProbeTarget(state.name, state.pid, state.start_time, state.labels)
            for forget in self.forget_hooks:
                forget(target)
        self.claims.leave(state, time.time())
        state.tree.reset(None)
        state.reset_process()

    def resolve_memory_limit(self, state: InstanceState) -> None:
        """The limit to judge against: configured, else the cgroup's, else the host's RAM."""
        configured = state.spec.memory_limit
        if configured != "auto":
            state.memory_limit, state.memory_limit_source = float(configured), "config"
            return
        limit = None
        if state.pid is not None:
            try:
                limit = cgroup_memory_limit(state.pid)
            except ProbeError:
                limit = None
        if limit:
            state.memory_limit, state.memory_limit_source = float(limit), "cgroup"
        else:
            state.memory_limit, state.memory_limit_source = float(host_memory_total()), "host"
