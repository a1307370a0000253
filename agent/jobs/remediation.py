"""The remediation engine inside the agent: its hooks, and the job that turns findings into requests.

Everything the engine may do to an instance goes through the hooks built here: finding the
current process (`locate`), restarting a managed command, purging through the allocator hook,
capturing evidence before a restart (`agent.jobs.evidence`), the warm-up gate that holds the slot
(`agent.jobs.warmup`). The job runs `Engine.step` in a worker thread every `remediation.interval`:
first the crash-loop findings (`agent.jobs.crashloop`), then one request per open finding and one
`InstanceView` per tracked instance (`view_from_state`); after it, escalated managed instances have
their relaunches held, and released once the escalation is cleared or expires.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

from agent.config.model import LatencySpec
from agent.core.errors import ProbeError
from agent.core.records import ProbeTarget, ProcessIdentity
from agent.jobs.crashloop import CrashLoops
from agent.jobs.detection import Detection
from agent.jobs.evidence import captures as evidence_captures
from agent.jobs.purge import purge_instance
from agent.jobs.warmup import warmup_gate
from agent.notify.external import external_findings
from agent.state.eventlog import EventLog
from agent.state.identities import AdoptedProcess
from agent.state.store import Store
from agent.watch.instances import InstanceState
from agent.watch.tracker import Tracker
from probes.allocator import hook_socket_for
from probes.linux.procfs import process_identity, read_cmdline, same_process
from remediation.config import RemediationSection, WarmupSection
from remediation.engine import Engine, EngineHooks
from remediation.model import Decision, InstanceView, RemediationRequest

REMEDIABLE = ("leak", "oom-risk", "fragmentation", "slow", "external", "crash-loop")


def view_from_state(state: InstanceState) -> InstanceView:
    """The engine's view of one tracked instance.

    Its command line is the one recorded when the tracker adopted the process (`pid`, `pidfile`
    instances), so that the check before a signal compares the pid against what was adopted, not
    against whatever it runs now. Otherwise (a `cmdline` match, a child medic launched, which may
    `exec` its program) it is read now (cheap: one small file).
    """
    up = state.status == "up" and state.pid is not None and state.start_time is not None
    cmdline: tuple[str, ...] = ()
    adopted = state.adopted
    if up and adopted is not None and not adopted.launched and _follows(adopted, state):
        cmdline = adopted.cmdline
    elif up:
        try:
            cmdline = tuple(read_cmdline(state.pid))  # type: ignore[arg-type]
        except ProbeError:
            up = False
    return InstanceView(
        name=state.name,
        pid=state.pid if up else None,
        start_time=state.start_time if up else None,
        cmdline=cmdline,
        labels=dict(state.labels),
        ready=up,
        managed=state.spec.match.managed,
    )


def _follows(adopted: AdoptedProcess, state: InstanceState) -> bool:
    """Is the adopted record that of the process the instance follows now?"""
    return (
        adopted.pid == state.pid
        and state.start_time is not None
        and same_process(adopted.start_time, state.start_time)
    )


def tracker_locator(tracker: Tracker, refresh: bool = True) -> Callable[[str], ProcessIdentity | None]:
    """`locate(name)`: the instance's current process, reconciling first so a new pid is seen at once."""

    def locate(name: str) -> ProcessIdentity | None:
        if refresh:
            tracker.reconcile(scan=True)
        state = tracker.get(name)
        if state is None or state.status != "up" or state.pid is None or state.start_time is None:
            return None
        try:
            identity = process_identity(state.pid)
        except ProbeError:
            return None
        return identity if same_process(identity.start_time, state.start_time) else None

    return locate


class Remediation:
    def __init__(
        self,
        config: RemediationSection,
        tracker: Tracker,
        store: Store,
        events: EventLog,
        detection: Detection,
    ) -> None:
        self.config = config
        self.tracker = tracker
        self.detection = detection
        self.events = events
        hooks = EngineHooks(
            locate=tracker_locator(tracker),
            managed_restart=lambda name, timeout: tracker.restart_managed(
                name, timeout, "restarted by remediation"
            ),
            purge=self._purge,
            can_purge=self._can_purge,
            warmup_gate=warmup_gate(self._warmup_settings, self._latency),
            captures=evidence_captures(store, self._target),
            on_escalate=lambda view, request, intent: self.sync_holds(),
        )
        self.engine = Engine.from_config(
            config,
            store=store,
            events=events,
            agent_id=f"{socket.gethostname()}:{os.getpid()}",
            state_dir=store.dir,
            hooks=hooks,
        )
        self._stepping = threading.Lock()
        self.crash_loops = CrashLoops(
            tracker, detection, config.ladder.crash_loop, self.engine.ledger.reset_at
        )
        self.sync_holds()  # an escalation from before an agent restart holds from its first launch on

    # ------------------------------------------------------------------------------ the job
    def step(self, now: float | None = None) -> None:
        """One remediation step (the scheduled job; `ask` runs one at once): one at a time."""
        with self._stepping:
            now = time.time() if now is None else now
            self.crash_loops.check(now)  # a finding whatever the mode; only enforce mode holds relaunches
            with self.tracker.lock:
                views = [view_from_state(state) for state in self.tracker.states.values()]
            self.engine.step(now, self.requests(), views)
            self.sync_holds()

    def ask(self, request: RemediationRequest) -> tuple[Decision, Decision | None]:
        """A person's restart request: kept by the engine, then judged by a step run at once, so the
        answer says what happens to it (started, would restart in dry-run, or held and why).
        Returns (the engine's acceptance, the step's decision for the instance or None)."""
        accepted = self.engine.submit(request)
        if not accepted.ok:
            return accepted, None
        self.step()
        last = self.engine.last
        return accepted, (last.decisions.get(request.instance) if last is not None else None)

    def sync_holds(self) -> None:
        """Escalated managed instances are not relaunched (enforce mode); the others are, as configured."""
        escalated = {e["instance"]: e for e in self.engine.ledger.escalations()}
        for name in list(self.tracker.managed):
            escalation = escalated.get(name) if self.config.mode == "enforce" else None
            if escalation is not None:
                self.tracker.hold_relaunch(
                    name, f"escalated ({escalation['code']}); `medic clear {name}` lets it run again"
                )
            else:
                self.tracker.release_relaunch(name, "the escalation ended")

    def clear(self, name: str, by: str | None) -> bool:
        """A person looked at an escalated instance: remediation and relaunches may act again at once."""
        cleared = self.engine.clear_escalation(name, by)
        self.sync_holds()
        self.crash_loops.check(time.time())
        return cleared

    def requests(self) -> list[RemediationRequest]:
        """One request per open finding that remediation may act on, the detectors' and the external
        ones (firing Alertmanager alerts mapped to an instance): all go through the same policy and budget."""
        out = [
            RemediationRequest(
                found["instance"],
                "external",
                found["id"],
                found["summary"],
                evidence=dict(found["evidence"]),
                requested_at=found["opened_at"],
                finding=dict(found),
            )
            for found in external_findings(self.detection.store, state="open")
        ]
        for finding in self.detection.open_findings():
            if finding.kind not in REMEDIABLE:
                continue
            ttoom = finding.evidence.get("time_to_oom_seconds")
            # only a critical leak or OOM risk has a deadline to plan a restart by; the policy
            # shows the others as watched (`remediation.policy`)
            deadline = (
                finding.updated_at + ttoom
                if finding.kind in ("leak", "oom-risk")
                and finding.severity == "critical"
                and isinstance(ttoom, (int, float))
                and ttoom == ttoom
                else None
            )
            out.append(
                RemediationRequest(
                    finding.instance,
                    finding.kind,
                    finding.id,
                    finding.summary,
                    deadline=deadline,
                    evidence=dict(finding.evidence),
                    # a crash loop is about the instance, not one of its processes
                    start_time=None if finding.kind == "crash-loop" else finding.lifetime_start,
                    requested_at=finding.opened_at,
                    finding=finding.to_dict(),
                )
            )
        return out

    def close(self) -> None:
        self.engine.close()

    # ------------------------------------------------------------------------------ hooks
    def _target(self, view: InstanceView) -> ProbeTarget | None:
        state = self.tracker.get(view.name)
        if state is None or state.pid is None or state.start_time is None:
            return None
        return ProbeTarget(state.name, state.pid, state.start_time, state.labels, state.settings)

    def _warmup_settings(self, name: str) -> WarmupSection | None:
        return (self.config.for_instance(name).verify or self.config.verify).warmup

    def _latency(self, name: str) -> LatencySpec | None:
        state = self.tracker.get(name)
        return state.spec.latency if state is not None else None

    def _can_purge(self, view: InstanceView) -> bool:
        target = self._target(view)
        if target is None:
            return False
        try:
            return bool(hook_socket_for(target))
        except ProbeError:
            return False

    def _purge(self, view: InstanceView, timeout: float) -> Decision:
        target = self._target(view)
        if target is None:
            return Decision.block("purge", "gone", f"{view.name} has no running process")
        try:
            result = purge_instance(target, self.events, "remediation: fragmentation")
        except ProbeError as exc:
            return Decision.block("purge", "purge_failed", str(exc))
        return Decision.allow("purge", "allocator purged", released_bytes=result["returned_bytes"], **result)
