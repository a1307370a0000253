"""Where the API listens: the socket the agent binds before anything is launched, and the uvicorn
server that serves on it.

The socket is bound by the agent itself, so that a busy address stops start-up with one line (a
`ConfigError`) before a managed command runs; the server leaves SIGTERM/SIGINT to the agent, which
stops its jobs and children before the server.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import uvicorn

from agent.core.errors import ConfigError


class AgentServer(uvicorn.Server):
    """uvicorn without its own signal handling: the agent owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror}; choose another address with "
            "--listen or agent.listen (port 0 picks a free one)"
        ) from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock
