"""The event log: every state change worth knowing goes to the store (durable) and to the agent's log.

An event's severity ranks it for people (alerts, `medic events`); the log level says how the agent
itself fares. So what medic found about the processes it watches (a finding, however critical, and an
instance handed to a person) is logged at WARNING at most: ERROR and CRITICAL are left for the
agent's own failures (a coordinator that does not answer, a notification given up on).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agent.core.errors import StoreError
from agent.core.records import Event
from agent.core.types import Severity
from agent.state.store import Store

log = logging.getLogger("medic.events")
_LEVELS = {
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
# events about the watched processes, not about the agent: logged at WARNING at most
_ABOUT_THE_WATCHED = ("finding_", "remediation_escalated")


def log_level(kind: str, severity: Severity) -> int:
    """The agent-log level of an event of `kind` with `severity`."""
    level = _LEVELS[severity]
    return min(level, logging.WARNING) if kind.startswith(_ABOUT_THE_WATCHED) else level


class EventLog:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._subscribers: list[Callable[[Event], None]] = []

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        """Call `callback(event)` after each event is stored; it must be quick, and its errors are logged."""
        self._subscribers.append(callback)

    def emit(
        self,
        kind: str,
        message: str,
        *,
        instance: str | None = None,
        severity: Severity = "info",
        **data: Any,
    ) -> Event:
        """Record an event; a store failure is logged, never raised into the caller's job."""
        event = Event(kind=kind, message=message, instance=instance, severity=severity, data=data)
        prefix = f"[{instance}] " if instance else ""
        log.log(log_level(kind, severity), "%s%s: %s", prefix, kind, message)
        try:
            self.store.add_event(event)
        except StoreError as exc:
            log.error("event not stored: %s", exc)
        for callback in self._subscribers:
            try:
                callback(event)
            except Exception:
                log.exception("event subscriber %r failed on %s", callback, kind)
        return event
