"""A state database SQLite cannot read (damaged, or not a database at all): told apart from one medic
cannot reach (permissions, a lock), because the fix differs: move the file aside, never chmod it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

# SQLite's result codes for a file that is no database (SQLITE_NOTADB) or a damaged one (SQLITE_CORRUPT)
_CORRUPT_CODES = frozenset({11, 26})
_CORRUPT_WORDS = ("malformed", "not a database")


def is_corrupt(exc: sqlite3.Error) -> bool:
    """Whether SQLite says the file is damaged or no database, not that it cannot reach it."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if isinstance(code, int):
        return code & 0xFF in _CORRUPT_CODES
    return any(word in str(exc) for word in _CORRUPT_WORDS)


def corrupt_advice(path: Path) -> str:
    """What to do about a corrupt `medic.db`: medic never deletes what an operator may want to inspect."""
    return (
        f"the state database {path} is corrupt: stop medic, move it aside with its -wal and -shm files "
        f"(`mv {path} {path}.corrupt`, the same for {path.name}-wal and {path.name}-shm) and start medic "
        "again: it creates a new one. What the old one held (samples, findings, events, the remediation "
        "ledger with its pause and escalations) is not carried over; `sqlite3 FILE .recover` may save some of it"
    )
