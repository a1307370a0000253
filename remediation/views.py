"""Adapters from the agent's tracker to the engine's inputs, so wiring the runtime stays a few lines.

views = [view_from_state(state) for state in tracker.states.values()]
hooks = EngineHooks(locate=tracker_locator(tracker), ...)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from agent.core.errors import ProbeError
from agent.core.records import ProcessIdentity
from probes.linux.procfs import process_identity, read_cmdline, same_process
from remediation.model import InstanceView

if TYPE_CHECKING:
    from agent.state.identities import AdoptedProcess
    from agent.watch.instances import InstanceState
    from agent.watch.tracker import Tracker


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
