"""SQL text shared by the tables medic keeps in SQLite: pure string building, no connection."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def where_clause(conditions: Iterable[tuple[str, Any]]) -> tuple[str, list[Any]]:
    """` WHERE a AND b` and its arguments from `(sql with one ?, value)` pairs; pairs whose value is
    None are left out, so optional filters read as one list."""
    kept = [(sql, value) for sql, value in conditions if value is not None]
    if not kept:
        return "", []
    return " WHERE " + " AND ".join(sql for sql, _ in kept), [value for _, value in kept]
