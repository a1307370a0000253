"""What every actuator is, and the two helpers they share: running an argv command and calling a URL.

An actuator restarts one instance and returns a `Decision` (stage `act`): ok with what it did, or
blocked with why not. It never raises for an expected failure (command failing or hanging, HTTP
error, process gone). Whether the instance came back is the verifier's job.
"""

from __future__ import annotations

import os
import signal
import string
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Protocol

from agent.core.bounded import bounded_request
from agent.core.records import ProcessIdentity
from remediation.model import Decision, InstanceView, RemediationRequest

STAGE = "act"
MAX_ANSWER_BYTES = 2**20  # an actuator endpoint acknowledges; OUTPUT_LIMIT of it is kept
OUTPUT_LIMIT = 8192  # bytes of command output kept in the ledger (the tail)

# locate(instance name) -> the instance's current process, or None; the runtime's tracker provides it
Locator = Callable[[str], ProcessIdentity | None]


class Actuator(Protocol):
    kind: str

    def restart(self, view: InstanceView, request: RemediationRequest | None, timeout: float) -> Decision: ...


def fill(template: str, view: InstanceView, request: RemediationRequest | None) -> str:
    """Replace `{instance}`, `{pid}`, `{fleet}`, `{finding_id}`, `{kind}` (validated in the config)."""
    values = {
        "instance": view.name,
        "pid": "" if view.pid is None else str(view.pid),
        "fleet": view.fleet,
        "finding_id": request.finding_id if request else "",
        "kind": request.kind if request else "",
    }
    return string.Formatter().vformat(template, (), values)


def run_command(
    argv: Sequence[str], timeout: float, stage: str, env: Mapping[str, str] | None = None
) -> Decision:
    """Run `argv` (no shell) in its own session; a hang is killed with its children after `timeout`."""
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        except OSError as exc:
            return Decision.block(
                stage,
                "cannot-run",
                f"cannot run {argv[0]!r}: {exc.strerror or exc}; check the command and its path",
            )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            return Decision.block(
                stage,
                "timeout",
                f"{argv[0]} did not finish within {timeout:g}s; killed it (and its children)",
                output=_tail(out),
            )
        output = _tail(out)
    if code != 0:
        status = f"signal {-code}" if code < 0 else f"status {code}"
        last = output.strip().splitlines()[-1:] if output.strip() else []
        return Decision.block(
            stage,
            "failed",
            f"{argv[0]} exited with {status}" + (f": {last[0][:200]}" if last else ""),
            output=output,
            exit_status=code,
        )
    return Decision.allow(stage, f"{argv[0]} succeeded", output=output, exit_status=0)


def _tail(out: IO[bytes]) -> str:
    out.seek(0, os.SEEK_END)
    size = out.tell()
    out.seek(max(0, size - OUTPUT_LIMIT))
    return out.read().decode("utf-8", "replace")


def call_url(
    method: str,
    url: str,
    timeout: float,
    stage: str,
    *,
    json_body: object = None,
    headers: Mapping[str, str] | None = None,
) -> Decision:
    """One HTTP request; 2xx is ok, anything else (or no answer) is blocked with the reason."""
    import httpx  # loaded by the first HTTP actuator or hook: an agent without one does not carry it

    try:
        response = bounded_request(
            httpx, method, url, max_bytes=MAX_ANSWER_BYTES, seconds=3 * timeout,
            json=json_body, headers=dict(headers or {}), timeout=timeout, trust_env=False,
        )  # fmt: skip
    except httpx.TimeoutException:
        return Decision.block(stage, "timeout", f"{method} {url}: no answer within {timeout:g}s")
    except httpx.HTTPError as exc:
        return Decision.block(stage, "unreachable", f"{method} {url}: {exc.__class__.__name__}: {exc}")
    body = response.text[:OUTPUT_LIMIT]
    if not 200 <= response.status_code < 300:
        return Decision.block(
            stage,
            "http-error",
            f"{method} {url} answered HTTP {response.status_code}: {body[:200]}",
            output=body,
        )
    return Decision.allow(stage, f"{method} {url} answered HTTP {response.status_code}", output=body)
