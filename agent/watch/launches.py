"""A managed instance's launches as the instance sees them: a launch that fails, an exit, relaunches
held while a person is asked to look, and the stop of every managed child at once. The tracker calls
these under its lock; each records what happened as one event.
"""

from __future__ import annotations

import threading

from agent.state.eventlog import EventLog
from agent.watch.instances import InstanceState
from agent.watch.supervisor import Exit, ManagedProcess, exit_status


def launch(state: InstanceState, managed: ManagedProcess, events: EventLog, now: float) -> None:
    """Launch the command; one that cannot start leaves the instance `exited` (127, as a shell says
    it) with the reason, and is tried again after its back-off."""
    try:
        managed.launch()
    except OSError as exc:
        if managed.log_path is not None and exc.filename == str(managed.log_path):
            why = f"cannot open its log {managed.log_path}: {exc.strerror}"
        else:
            why = f"cannot start {managed.argv[0]!r}: {exc.strerror}"
        managed.exit_code, managed.ended = 127, True
        managed.next_launch_at = now + managed.backoff
        managed.backoff = min(managed.backoff * 2, 300.0)
        state.status, state.status_reason, state.exit_code = "exited", why, 127  # as a shell says it
        events.emit(
            "instance_launch_failed",
            f"{why}; check the command and its path",
            instance=state.name,
            severity="error",
            argv=managed.argv,
        )


def record_exit(state: InstanceState, managed: ManagedProcess, end: Exit, events: EventLog) -> None:
    """The instance's process ended: its status, why, and whether (and when) it is relaunched."""
    status = None if end.code is None else exit_status(end.code)
    state.status, state.exit_code = "exited", status
    if status is None:  # adopted: not our child, so only its end is seen
        state.status_reason = "exited (exit status unknown: it was launched by an earlier medic)"
        message = f"pid {state.pid} exited; launched by an earlier medic, its exit status is unknown"
    else:
        state.status_reason = f"exited with status {status}"
        message = f"pid {state.pid} exited with status {status}"
    if managed.held is not None:
        state.status_reason += f"; not relaunched: {managed.held}"
    elif managed.restart_on_exit and not managed.stopping:
        state.status_reason += f"; relaunch in {managed.backoff:.0f}s"
    events.emit(
        "instance_exited",
        message,
        instance=state.name,
        severity="info" if status == 0 else "warning",
        pid=state.pid,
        exit_status=status,
    )


def hold_relaunch(
    name: str, managed: ManagedProcess, state: InstanceState | None, reason: str, events: EventLog
) -> bool:
    """Stop relaunching a managed instance (its running process is left alone); True when newly held."""
    if managed.held == reason:
        return False
    newly = managed.held is None
    managed.held = reason
    if newly and state is not None and state.status == "exited":
        state.status_reason = f"exited; not relaunched: {reason}"
    if newly:
        events.emit(
            "instance_relaunch_held",
            f"no automatic relaunch: {reason}",
            instance=name,
            severity="warning",
        )
    return newly


def release_relaunch(name: str, managed: ManagedProcess, why: str, events: EventLog) -> bool:
    """Relaunch a held managed instance again as configured; True when it was held."""
    if managed.held is None:
        return False
    managed.held = None
    managed.next_launch_at = 0.0
    managed.backoff = 1.0
    events.emit("instance_relaunch_released", f"relaunches resume: {why}", instance=name)
    return True


def stop_all(managed: dict[str, ManagedProcess]) -> dict[str, int | None]:
    """Stop every managed child in parallel (TERM, then KILL after its stop_timeout); each one's
    exit status, None when unknown."""
    results: dict[str, int | None] = {}
    threads = []
    for name, process in managed.items():
        process.stopping = True

        def stop(name: str = name, process: ManagedProcess = process) -> None:
            results[name] = process.stop()

        thread = threading.Thread(target=stop, name=f"stop-{name}")
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return results
