"""The two builds under test: launched on free loopback ports, waited for, watched, always stopped.

A launched server runs in its own session (so a Ctrl-C at the terminal reaches medic, which stops
it in order) with the parent-death signal set (so it dies with medic even after a SIGKILL).
Its stdout and stderr are kept, the last `OUTPUT_LINES` lines, to show why it failed. `stop()`
sends TERM to its whole process group, then KILL after `stop_timeout`, and reaps it. A server
given by URL and pid is only watched, never signalled.
"""

from __future__ import annotations

import ctypes
import http.client
import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from urllib.parse import urlsplit

from agent.core.errors import MedicError
from agent.guardrail.options import ServerSpec
from probes.linux.procfs import process_identity

OUTPUT_LINES = 40
MAX_LINE = 400
PR_SET_PDEATHSIG = 1


class ServerFailed(MedicError):
    """A build did not start, or stopped while it was measured (exit 3)."""

    exit_code = 3

    def __init__(self, name: str, why: str, output: list[str]) -> None:
        self.name, self.why, self.output = name, why, output
        tail = "\n".join(f"  {line}" for line in output[-15:]) or "  (no output)"
        super().__init__(f"the {name} server {why}; its last output:\n{tail}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: SIGTERM when medic goes away, whatever way it goes."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class Server:
    def __init__(self, spec: ServerSpec, stop_timeout: float = 5.0) -> None:
        self.spec = spec
        self.name = spec.name
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.output: deque[str] = deque(maxlen=OUTPUT_LINES)
        self._reader: threading.Thread | None = None
        self.port: int | None = None
        self.base_url = spec.url or ""
        self.pid = spec.pid or 0
        self.start_time = 0.0

    def launch(self) -> None:
        if not self.spec.launched:
            self._identify()
            return
        self.port = free_port()
        argv = self.spec.command(self.port)
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            raise ServerFailed(self.name, f"could not be started ({argv[0]}: {exc.strerror})", []) from None
        self.pid = self.proc.pid
        self.base_url = f"http://127.0.0.1:{self.port}/"
        self._reader = threading.Thread(target=self._read_output, name=f"{self.name}-output", daemon=True)
        self._reader.start()
        self._identify()

    def _identify(self) -> None:
        try:
            self.start_time = process_identity(self.pid).start_time
        except MedicError as exc:
            if self.proc is not None and self.proc.poll() is not None:
                self.check_alive()
            raise ServerFailed(
                self.name, f"has no process {self.pid} to measure ({exc})", self.lines()
            ) from None

    def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.output.append(raw[:MAX_LINE].decode("utf-8", "replace").rstrip("\r\n"))

    def lines(self) -> list[str]:
        if self._reader is not None:
            self._reader.join(timeout=0.5 if self.proc is not None and self.proc.poll() is not None else 0)
        return list(self.output)

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        try:
            return process_identity(self.pid).start_time == self.start_time
        except MedicError:
            return False

    def check_alive(self, during: str = "while it was measured") -> None:
        if self.alive():
            return
        if self.proc is not None:
            code = self.proc.returncode
            how = f"killed by signal {-code}" if code < 0 else f"with status {code}"
            raise ServerFailed(self.name, f"exited {how} {during}", self.lines())
        raise ServerFailed(self.name, f"(pid {self.pid}) is gone {during}", [])

    def wait_ready(self, ready_path: str | None, timeout: float) -> float:
        """Seconds until it answers: a 2xx on `ready_path`, else a TCP connect; ServerFailed if not."""
        started = time.monotonic()
        parts = urlsplit(self.base_url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        last = "no answer yet"
        while time.monotonic() - started < timeout:
            self.check_alive("before it was ready")
            try:
                if ready_path is None:
                    with socket.create_connection((host, port), timeout=1.0):
                        return time.monotonic() - started
                conn = http.client.HTTPConnection(host, port, timeout=2.0)
                try:
                    conn.request("GET", ready_path)
                    reply = conn.getresponse()
                    reply.read(65536)
                    if 200 <= reply.status < 300:
                        return time.monotonic() - started
                    last = f"GET {ready_path} answered HTTP {reply.status}"
                finally:
                    conn.close()
            except (OSError, http.client.HTTPException) as exc:
                last = str(exc) or type(exc).__name__
            time.sleep(0.1)
        what = f"GET {ready_path} answering 2xx" if ready_path else f"a connection to port {port}"
        raise ServerFailed(
            self.name, f"was not ready within {timeout:g}s (waited for {what}; {last})", self.lines()
        )

    def stop(self) -> None:
        """TERM to the process group, KILL after `stop_timeout`; reap. Idempotent; never raises."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._signal_group(signal.SIGKILL)  # whatever it left behind in its session
        if self._reader is not None:
            self._reader.join(timeout=1.0)
        if proc.stdout is not None:
            proc.stdout.close()

    def _signal_group(self, signum: int) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


class Servers:
    """Both builds, stopped on the way out of the `with` block whatever happened inside."""

    def __init__(self, baseline: ServerSpec, candidate: ServerSpec) -> None:
        self.baseline = Server(baseline)
        self.candidate = Server(candidate)

    @property
    def both(self) -> tuple[Server, Server]:
        return self.baseline, self.candidate

    def __enter__(self) -> Servers:
        try:
            for server in self.both:
                server.launch()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        # a second Ctrl-C while stopping must not leave a server running: shield the stops from it
        previous = (
            signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
        )
        if previous is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for server in self.both:
                server.stop()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def wait_ready(self, ready_path: str | None, timeout: float) -> dict[str, float]:
        return {server.name: server.wait_ready(ready_path, timeout) for server in self.both}

    def check_alive(self) -> None:
        for server in self.both:
            server.check_alive()
