"""The CLI's view of a running agent: where it is, its admin token, and GET/POST JSON with one clear
error when it cannot be reached.

The address and the token come from the flags, then the environment, then the agent's state
directory (`--state-dir` or MEDIC_STATE_DIR: `agent.json` says where it listens, `admin.token` holds
the token). Both files are read as secrets: `agent.json` decides where the token is sent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent.core.bounded import AnswerTooLarge, AnswerTooSlow, read_bounded
from agent.core.errors import AgentUnreachable, ApiError, UsageError
from probes.linux.fstrust import read_private_file
from probes.linux.secrets import read_token

DEFAULT_URL = "http://127.0.0.1:9464"
DEFAULT_STATE_DIR = "medic-state"
MAX_REPLY_BYTES = 128 * 2**20  # the largest answer: a 16 MiB evidence item, JSON-escaped
REPLY_DEADLINE_FACTOR = 3  # a whole answer within this many times the per-read timeout
replies_received = 0  # JSON objects the agent answered in this process: see `agent.cli.main`


def state_dir(explicit: str | None) -> str | None:
    """The state directory the user named (--state-dir, else MEDIC_STATE_DIR), or None."""
    return explicit or os.environ.get("MEDIC_STATE_DIR") or None


def agent_url(explicit: str | None, state: str | None = None) -> str:
    """The agent's API address from --url, MEDIC_URL, STATE_DIR/agent.json or the default; a malformed
    one is a usage error, not an unreachable agent."""
    url = explicit or os.environ.get("MEDIC_URL")
    source = "--url" if explicit else "MEDIC_URL"
    directory = state_dir(state)
    if not url and directory:
        url, source = _url_from_state(Path(directory) / "agent.json"), f"{directory}/agent.json"
    return check_url(url or DEFAULT_URL, source)


def check_url(url: str, source: str = "--url") -> str:
    """`url` without a trailing slash when it is http(s)://HOST[:PORT][/PATH]; else a UsageError."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{source}: {url!r} is not an http(s) URL; expected e.g. {DEFAULT_URL}")
    return url.rstrip("/")


def _url_from_state(path: Path) -> str:
    try:
        info = json.loads(read_private_file(path, "the agent file"))
    except FileNotFoundError:
        raise UsageError(
            f"{path} does not exist: is the agent running with this state_dir? Or give --url"
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError:
        raise UsageError(f"{path} is not the JSON an agent writes; give --url") from None
    if not isinstance(info, dict) or not isinstance(info.get("url"), str):
        raise UsageError(f"{path} names no url; give --url")
    return info["url"]


def admin_token(token_file: str | None, state: str | None = None) -> str:
    """The admin token from --token-file, MEDIC_TOKEN, MEDIC_TOKEN_FILE or STATE_DIR/admin.token
    (default ./medic-state/admin.token); a file others may read is refused with the chmod that fixes it."""
    if not token_file and os.environ.get("MEDIC_TOKEN"):
        return os.environ["MEDIC_TOKEN"].strip()
    default = Path(state_dir(state) or DEFAULT_STATE_DIR) / "admin.token"
    if token_file:
        return read_token(Path(token_file), "--token-file")
    candidates = [("MEDIC_TOKEN_FILE", os.environ.get("MEDIC_TOKEN_FILE")), ("the token file", str(default))]
    for where, candidate in candidates:
        if candidate and Path(candidate).exists():  # the implicit places may hold none
            return read_token(Path(candidate), where)
    raise UsageError(
        "this command needs the agent's admin token: pass --state-dir (the agent's state_dir), "
        "--token-file (its admin.token or agent.token_file), or set MEDIC_TOKEN"
    )


def get_json(url: str, path: str, params: dict[str, Any] | None = None, timeout: float = 5.0) -> Any:
    return _request("GET", url, path, params=params, timeout=timeout)


def post_json(url: str, path: str, body: dict[str, Any], token: str, timeout: float = 30.0) -> Any:
    return _request(
        "POST", url, path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
    )


def _request(method: str, url: str, path: str, timeout: float, **kwargs: Any) -> Any:
    """One request; the answer must be a JSON object read within `MAX_REPLY_BYTES` and a total of
    `REPLY_DEADLINE_FACTOR * timeout` seconds: whatever else answers at the address (a proxy's
    page, a server that drips or never stops) is an `ApiError` that says so, never a traceback."""
    import httpx

    global replies_received
    try:
        with httpx.stream(method, f"{url}{path}", timeout=timeout, **kwargs) as response:
            raw = read_bounded(response.iter_bytes(), MAX_REPLY_BYTES, REPLY_DEADLINE_FACTOR * timeout)
    except AnswerTooLarge:
        raise ApiError(
            f"{url}{path} answered more than {MAX_REPLY_BYTES // 2**20} MiB; is this medic?"
        ) from None
    except AnswerTooSlow as exc:
        raise AgentUnreachable(
            f"the agent at {url} was still sending its answer after {exc.args[0]:.0f}s; is it overloaded?"
        ) from None
    except httpx.TimeoutException:
        raise AgentUnreachable(
            f"the agent at {url} did not answer within {timeout:.0f}s; is it overloaded?"
        ) from None
    except httpx.HTTPError as exc:
        raise AgentUnreachable(
            f"cannot reach the agent at {url} ({type(exc).__name__}); start it with `medic run`, "
            "or point --url / MEDIC_URL / --state-dir at it"
        ) from None
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise ApiError(
            f"{url}{path} answered {response.status_code} with non-JSON content; is this medic?"
        ) from None
    if response.status_code >= 400:
        message = body.get("error") if isinstance(body, dict) else None
        raise ApiError(f"{message or response.reason_phrase} (HTTP {response.status_code})")
    if not isinstance(body, dict):
        raise ApiError(
            f"{url}{path} answered a JSON {type(body).__name__}, not the object medic's API returns; "
            "is this medic?"
        )
    replies_received += 1
    return body
