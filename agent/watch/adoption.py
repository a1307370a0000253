"""Which process an instance adopts: the identity rules the tracker applies before it follows one.

A new process behind a `pid` instance is its restart only when it runs the program and command line
the instance ran when adopted; a new process named by a `pidfile` instance's file, when it does so too
or when the pidfile was written anew for it. Anything else is refused: reported once (until it goes
away or the pidfile is written anew) and never adopted, so never probed or signalled. Adopted
identities go to the ledger (`identities.json`); after an agent crash, the managed children an earlier
agent launched are adopted when their instance is configured the same way, and stopped otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
from collections.abc import Callable

from agent.config.model import InstanceSpec
from agent.core.errors import ProbeError
from agent.core.records import ProcessIdentity
from agent.state.eventlog import EventLog
from agent.state.identities import (
    AdoptedProcess,
    IdentityLedger,
    PidfileStamp,
    describe,
    pidfile_rewritten,
    same_program,
)
from agent.watch.instances import InstanceState
from agent.watch.supervisor import ManagedProcess
from probes.linux.pidfd import IdentityChanged, pin
from probes.linux.procfs import same_process

log = logging.getLogger("medic.tracker")


def matcher_key(spec: InstanceSpec) -> str:
    """The matcher an identity was adopted under; a changed matcher inherits nothing."""
    match = spec.match
    if match.managed:
        cwd = str(match.cwd) if match.cwd is not None else None
        return "command:" + json.dumps([match.command, cwd, sorted(match.env.items())])
    if match.pid is not None:
        return f"pid:{match.pid}"
    if match.pidfile is not None:
        return f"pidfile:{match.pidfile}"
    return f"cmdline:{match.cmdline}"


def is_process(record: AdoptedProcess, identity: ProcessIdentity) -> bool:
    """True when `record` describes the process `identity` (pid and start time, within a tick)."""
    return record.pid == identity.pid and same_process(record.start_time, identity.start_time)


class Adoption:
    """The rules, the refusals they lead to, and the ledger the adopted identities are kept in."""

    def __init__(self, ledger: IdentityLedger, events: EventLog) -> None:
        self.ledger = ledger
        self.events = events
        self._refused_stamps: dict[str, PidfileStamp | None] = {}  # the pidfile as it was at a refusal

    # ------------------------------------------------------------------------------ the rules
    def reference(self, state: InstanceState) -> AdoptedProcess | None:
        """What a new process behind a `pid`/`pidfile` instance must run to be the instance: what
        the instance ran when adopted (in this agent's run, else as an earlier agent recorded it)."""
        match = state.spec.match
        if match.pid is None and match.pidfile is None:
            return None  # cmdline: the regex is the matcher; command: medic's own child
        if state.adopted is not None:
            return state.adopted
        record = self.ledger.get(state.name)
        return record if record is not None and record.match == matcher_key(state.spec) else None

    @staticmethod
    def successor(
        state: InstanceState,
        reference: AdoptedProcess,
        identity: ProcessIdentity,
        stamp: PidfileStamp | None,
    ) -> tuple[bool, str]:
        """Is `identity`, a new process behind the instance's pid or pidfile, the instance's restart?
        A `pidfile` instance's when its pidfile was written anew for it, or when it runs what the
        instance ran; a `pid` instance's only in the second case. With the reason if not."""
        rewritten = None
        if state.spec.match.pidfile is not None:
            ok, rewritten = pidfile_rewritten(reference, stamp, identity.start_time)
            if ok:
                return True, rewritten
        ok, detail = same_program(reference, identity.pid)
        return ok, detail if rewritten is None else f"{detail}, and {rewritten}"

    # ------------------------------------------------------------------------------ refusals
    def already_refused(
        self, state: InstanceState, identity: ProcessIdentity, stamp: PidfileStamp | None
    ) -> bool:
        """True when this process, named by this pidfile stamp, was refused and reported before."""
        return identity == state.refused and stamp == self._refused_stamps.get(state.name)

    def clear_refusal(self, state: InstanceState) -> int | None:
        """Nothing is refused any more; returns the pid that was."""
        gone, state.refused = (state.refused.pid if state.refused else None), None
        self._refused_stamps.pop(state.name, None)
        return gone

    def refuse(
        self,
        state: InstanceState,
        reference: AdoptedProcess,
        identity: ProcessIdentity,
        detail: str,
        stamp: PidfileStamp | None,
    ) -> str:
        """`identity` holds the instance's pid (or is named by its pidfile) but is not the instance:
        record and report the refusal; returns the instance's status reason."""
        state.refused = identity
        self._refused_stamps[state.name] = stamp
        old = state.pid if state.pid is not None else reference.pid
        if state.spec.match.pidfile is not None:
            hint = (
                f"If that process is {state.name} started another way, write its pid to "
                f"{state.spec.match.pidfile} again (a service manager's restart does): medic then adopts it"
            )
        else:
            hint = (
                f"If that process is {state.name} started another way, stop medic, delete "
                f"{self.ledger.path} and start medic again"
            )
        self.events.emit(
            "instance_down",
            f"pid {old} is gone; pid {identity.pid} is another process ({detail}): not adopted. {hint}",
            instance=state.name,
            severity="warning",
            pid=old,
            other_pid=identity.pid,
            reason="not-the-instance",
        )
        reason = f"pid {old} is gone; pid {identity.pid} runs another program"
        if state.spec.match.pidfile is not None:
            reason += " and the pidfile was not written anew for it"
        return reason

    # ------------------------------------------------------------------------------ the ledger
    def remember(self, state: InstanceState, identity: ProcessIdentity, stamp: PidfileStamp | None) -> None:
        """Record what `identity` runs, for the instances whose identity must survive an agent
        restart (pid, pidfile, command)."""
        match = state.spec.match
        if match.cmdline is not None:
            return
        try:
            record = describe(
                identity.pid, identity.start_time, matcher_key(state.spec), match.managed, stamp
            )
        except ProbeError:
            return  # it just exited: the next reconcile sees it gone
        state.adopted = record
        self.ledger.put(state.name, record)

    def restamp(self, state: InstanceState, identity: ProcessIdentity, stamp: PidfileStamp | None) -> None:
        """The pidfile was written again for the process already followed (a reload, a periodic
        rewrite): record it, so that only a write after this one counts as written for a successor."""
        record = state.adopted
        if (
            stamp is None
            or record is None
            or record.pidfile_stamp == stamp
            or not is_process(record, identity)
        ):
            return
        state.adopted = dataclasses.replace(record, pidfile_stamp=stamp)
        self.ledger.put(state.name, state.adopted)

    # ------------------------------------------------------------------------------ an earlier agent's children
    def earlier_children(
        self,
        managed: dict[str, ManagedProcess],
        states: dict[str, InstanceState],
        adopted: Callable[[InstanceState, AdoptedProcess], None],
    ) -> None:
        """Children an earlier agent launched and that outlived it: those whose instance is still
        configured the same way and that still run are adopted (`adopted` is called for each); the
        others are stopped (nothing else would)."""
        for name, record in list(self.ledger.records.items()):
            if not record.launched:
                continue
            child, state = managed.get(name), states.get(name)
            if child is not None and state is not None and record.match == matcher_key(state.spec):
                verdict = child.adopt(record.expected())
                if verdict.ok:
                    adopted(state, record)
                else:  # gone: launched by the caller, and the first reconcile records the restart
                    log.info("%s: the child of an earlier agent is gone: %s", name, verdict.message)
                    self.ledger.drop(name)
                continue
            why = "its command changed" if child is not None else "it is no longer configured"
            self._stop_orphan(name, record, why, state.spec.stop_timeout if state else 5.0)

    def _stop_orphan(self, name: str, record: AdoptedProcess, why: str, timeout: float) -> None:
        try:
            pinned = pin(record.expected())
        except IdentityChanged:
            self.ledger.drop(name)  # it is gone (or the pid is another process now): nothing to stop
            return
        with pinned:
            pinned.send(signal.SIGTERM)
            how = "TERM"
            if not pinned.wait_exit(timeout):
                pinned.send(signal.SIGKILL)
                pinned.wait_exit(10.0)
                how = f"TERM, then KILL after {timeout:g}s"
        self.events.emit(
            "instance_orphan_stopped",
            f"stopped pid {record.pid} ({how}), launched for {name} by an earlier medic: {why}",
            instance=name,
            severity="warning",
            pid=record.pid,
        )
        self.ledger.drop(name)
