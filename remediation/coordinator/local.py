"""`local` coordinator: the fleet's rules over a SQLite file that the agents of one host share
(`sqlite_store.py`: point them at one path)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from remediation.coordinator.base import Coordinator
from remediation.coordinator.sqlite_store import REOPEN_INTERVAL, SqliteStore


class LocalCoordinator(Coordinator):
    name = "local"

    def __init__(
        self,
        path: str | Path,
        *,
        namespace: str = "default",
        retention: float = 86400.0,
        timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
        reopen_interval: float = REOPEN_INTERVAL,
    ) -> None:
        store = SqliteStore(
            path, namespace=namespace, timeout=timeout, clock=clock, reopen_interval=reopen_interval
        )
        super().__init__(store, retention=retention, clock=clock)
        self.path = store.path
        self.namespace = namespace
