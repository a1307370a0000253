"""The agent's uvicorn server: a header timeout, a cap on open connections, a file-descriptor budget.

uvicorn times out idle keep-alive connections but not a request whose headers never finish, and
`limit_concurrency` answers 503 only once a request is parsed: a few hundred half-open connections
used to hold a file descriptor each until the agent ran out (EMFILE), and then its probes could not
open /proc and reported the instances down. `guarded_protocol` closes a connection whose request
headers are not complete `header_timeout` after it opened (or after its previous response), and
one whose request body is still arriving another `header_timeout` later (408: a body sent a byte at a
time would hold its connection for ever, and a few hundred of them the whole cap), and refuses connections beyond `max_connections` with a 503 and an immediate close. The cap is kept
below the process's RLIMIT_NOFILE, leaving `FD_RESERVE` descriptors for the store, probes and
children (`connection_budget`): with the default cap of 256, LimitNOFILE=4096 is ample.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("medic.http")

FD_RESERVE = 256  # descriptors left for the store, /proc reads, children's pipes, notifier sockets
MAX_HEADER_BYTES = 16 * 1024
REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b'content-length: 67\r\n\r\n{"error": "too many open connections to this agent; retry shortly"}'
)

BODY_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b'content-length: 52\r\n\r\n{"error": "the request body did not arrive in time"}'
)


class _Throttled:
    """A warning at most once per `every` seconds, with the count of those it held back."""

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self.last = -every
        self.held = 0

    def warn(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            self.held += 1
            return
        suffix = f" ({self.held} more like it in the last {self.every:g}s)" if self.held else ""
        log.warning(message + suffix, *args)
        self.last, self.held = now, 0


def connection_budget(max_connections: int, soft_nofile: int | None = None) -> int:
    """The connection cap that fits the descriptor limit: at most RLIMIT_NOFILE - FD_RESERVE, at least 8."""
    if soft_nofile is None:
        soft_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_nofile == resource.RLIM_INFINITY:
        return max_connections
    return max(8, min(max_connections, soft_nofile - FD_RESERVE))


def guarded_protocol(header_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a header timeout and a cap on open connections (`uvicorn.Config(http=…)`)."""
    refusals = _Throttled()
    timeouts = _Throttled()

    class GuardedH11Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_timer: asyncio.TimerHandle | None = None
            self._refused = False
            self._body_grace = False  # the request being read got its second header_timeout

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                self._refused = True
                refusals.warn(
                    "refused a connection: %d are open, the cap (agent.http.max_connections)", max_connections
                )
                transport.write(REFUSED)
                transport.close()
                return
            super().connection_made(transport)
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return
            self._cancel_header_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            super().data_received(data)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._body_grace = False
            if not self.transport.is_closing():
                self._arm_header_timer()  # the next request's headers get the same time

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(header_timeout, self._header_timeout)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                if not self.cycle.more_body:
                    return  # the whole request arrived in time: it is being served
                if not self._body_grace:  # its headers arrived in time: the body gets as long again
                    self._body_grace = True
                    self._arm_header_timer()
                    return
                timeouts.warn(
                    "closed a connection from %s: its request body was not complete within %gs",
                    self.client[0] if self.client else "?",
                    2 * header_timeout,
                )
                if not self.cycle.response_started:
                    self.transport.write(BODY_TIMEOUT)
                self.transport.close()
                return
            timeouts.warn(
                "closed a connection from %s: no complete request headers within %gs",
                self.client[0] if self.client else "?",
                header_timeout,
            )
            if self.conn.our_state in (h11.IDLE, h11.DONE):
                self.conn.send(h11.ConnectionClosed())
            self.transport.close()

    return GuardedH11Protocol


def server_config(app: Any, *, header_timeout: float, keep_alive: float, max_connections: int) -> Any:
    """The uvicorn config of the agent's API server, with the guarded protocol and the fd budget."""
    import uvicorn

    cap = connection_budget(max_connections)
    if cap < max_connections:
        log.warning(
            "agent.http.max_connections %d does not fit the open-file limit (RLIMIT_NOFILE %d): "
            "capping at %d; raise LimitNOFILE to at least %d",
            max_connections,
            resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            cap,
            max_connections + FD_RESERVE,
        )
    return uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",
        access_log=False,
        http=guarded_protocol(header_timeout, cap),
        timeout_keep_alive=max(1, round(keep_alive)),
        limit_concurrency=cap + 1,  # connections are capped by the protocol; this bounds running requests
        backlog=128,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )
