"""The ports the remediation engine needs from the agent, as structural protocols.

`agent.state.eventlog.EventLog` is an `EventSink` and `agent.state.store.Store` a `TableStore`
without naming them: the engine (like kured's checker, lock and rebooter) sees only these few
methods, so it can be tested with fakes and never imports the agent's concrete classes.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agent.core.types import Severity


class EventSink(Protocol):
    """Where state changes worth knowing go; `emit` never raises a storage failure into the caller."""

    def emit(
        self,
        kind: str,
        message: str,
        *,
        instance: str | None = None,
        severity: Severity = "info",
        **data: Any,
    ) -> object: ...


class TableStore(Protocol):
    """A SQLite database another part of medic keeps its own tables in (one writer, many readers)."""

    def ensure_schema(self, sql: str) -> None:
        """Create the caller's tables (idempotent `CREATE ... IF NOT EXISTS` statements)."""
        ...

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """The write connection inside one transaction, committed on exit and rolled back on error."""
        ...

    def query(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        """Read-only rows."""
        ...
