"""The remediation engine inside the agent: its hooks, and the job that turns findings into requests.

Everything the engine may do to an instance goes through the hooks built here: finding the
current process (`locate`), restarting a managed command, purging through the allocator hook,
capturing evidence before a restart. The job runs `Engine.step` in a worker thread every
`remediation.interval` with one request per open finding and one `InstanceView` per tracked
instance (`view_from_state`).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

from agent.core.errors import ProbeError
from agent.core.records import ProbeTarget, ProcessIdentity
from agent.jobs.detection import Detection
from agent.notify.external import external_findings
from agent.state.eventlog import EventLog
from agent.state.identities import AdoptedProcess
from agent.state.store import Store
from agent.watch.instances import InstanceState
from agent.watch.tracker import Tracker
from probes.allocator import hook_socket_for
from probes.linux.procfs import HOST_ROOT, proc_path, process_identity, read_cmdline, read_file, same_process
from remediation.config import RemediationSection
from remediation.engine import Engine, EngineHooks
from remediation.model import Decision, InstanceView, RemediationRequest

REMEDIABLE = ("leak", "oom-risk", "fragmentation", "slow", "external")


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
            captures={"smaps_rollup": self._smaps_rollup, "series": self._series_window},
        )
        self.engine = Engine.from_config(
            config,
            store=store,
            events=events,
            agent_id=f"{socket.gethostname()}:{os.getpid()}",
            state_dir=store.dir,
            hooks=hooks,
        )

    # ------------------------------------------------------------------------------ the job
    def step(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.tracker.lock:
            views = [view_from_state(state) for state in self.tracker.states.values()]
        self.engine.step(now, self.requests(), views)

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
            )
            for found in external_findings(self.detection.store, state="open")
        ]
        for finding in self.detection.open_findings():
            if finding.kind not in REMEDIABLE:
                continue
            ttoom = finding.evidence.get("time_to_oom_seconds")
            deadline = (
                finding.updated_at + ttoom
                if finding.kind in ("leak", "oom-risk") and isinstance(ttoom, (int, float)) and ttoom == ttoom
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
                    start_time=finding.lifetime_start,
                    requested_at=finding.opened_at,
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

    def _can_purge(self, view: InstanceView) -> bool:
        target = self._target(view)
        if target is None:
            return False
        try:
            return bool(hook_socket_for(target))
        except ProbeError:
            return False

    def _purge(self, view: InstanceView, timeout: float) -> Decision:
        from agent.jobs.purge import purge_instance

        target = self._target(view)
        if target is None:
            return Decision.block("purge", "gone", f"{view.name} has no running process")
        try:
            result = purge_instance(target, self.events, "remediation: fragmentation")
        except ProbeError as exc:
            return Decision.block("purge", "purge_failed", str(exc))
        return Decision.allow("purge", "allocator purged", released_bytes=result["returned_bytes"], **result)

    def _smaps_rollup(self, view: InstanceView, timeout: float) -> str | None:
        if view.pid is None:
            return None
        path = proc_path(HOST_ROOT, view.pid, "smaps_rollup")
        try:
            return read_file(path, view.pid).decode("ascii", "replace")
        except ProbeError:
            return None

    def _series_window(self, view: InstanceView, timeout: float) -> dict[str, Any]:
        """The last hour of the memory series: what the detectors saw before the restart."""
        now = time.time()
        store = self.detection.store
        return {
            metric: store.series(view.name, metric, now - 3600, now, step=10).points
            for metric in ("rss_bytes", "allocator_allocated_bytes", "allocator_resident_bytes")
            if metric in store.metrics(view.name)
        }
