"""The agent's full API app in-process (as `agent.runtime` builds it), over a real Store, for the HTTP tests."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import httpx

from agent.api.app import create_app
from agent.api.context import ApiContext
from agent.api.metrics import Telemetry
from agent.config.loader import validate_config
from agent.jobs.detection import Detection
from agent.jobs.remediation import Remediation
from agent.state.eventlog import EventLog
from agent.state.store import Store
from agent.watch.tracker import Tracker

TOKEN = "a" * 64
BASE = "http://127.0.0.1:9464"


class World:
    """Store, tracker, detection and remediation (dry-run, never stepped) behind `create_app`;
    `remediation` adds to the remediation section (a shared coordinator, say); `instances` replaces
    the one instance `svc` at `pid`."""

    def __init__(
        self,
        tmp_path: Path,
        pid: int,
        *,
        remediation: dict[str, Any] | None = None,
        instances: list[dict[str, Any]] | None = None,
        **context: Any,
    ) -> None:
        config = validate_config(
            {
                "instances": instances or [{"name": "svc", "match": {"pid": pid}}],
                "remediation": {"mode": "dry-run", **(remediation or {})},
            }
        )
        self.store = Store(tmp_path / "state")
        self.events = EventLog(self.store)
        self.tracker = Tracker(config.instances, self.store, self.events)
        self.telemetry = Telemetry(self.tracker)
        self.detection = Detection(
            self.tracker,
            self.store,
            self.events,
            config.detect.memory_params(),
            config.detect.slow_params(),
        )
        self.remediation = Remediation(
            config.remediation, self.tracker, self.store, self.events, self.detection
        )
        ctx = ApiContext(
            self.tracker,
            self.store,
            self.telemetry,
            self.events,
            TOKEN,
            detection=self.detection,
            remediation=self.remediation,
            notify=config.notify,
            **context,
        )
        self.app = create_app(ctx)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request through httpx's ASGI transport: an exception in the app is raised here."""

        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
                return await client.request(method, path, **kwargs)

        return asyncio.run(go())

    def close(self) -> None:
        self.remediation.close()
        self.store.close()


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def read_response(conn: socket.socket) -> tuple[int, bytes, bool]:
    """(status, body, closed): reads until the server closes the connection or 5 s pass."""
    data = b""
    closed = False
    try:
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                closed = True
                break
            data += chunk
    except TimeoutError:
        pass
    except ConnectionResetError:
        closed = True
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, body, closed
