"""The CLI's view of a running agent: GET/POST JSON with one clear error when it cannot be reached."""

from __future__ import annotations

import os
from typing import Any

from agent.core.errors import AgentUnreachable, ApiError, UsageError

DEFAULT_URL = "http://127.0.0.1:9464"


def agent_url(explicit: str | None) -> str:
    return (explicit or os.environ.get("MEDIC_URL") or DEFAULT_URL).rstrip("/")


def add_url_argument(parser) -> None:
    parser.add_argument("--url", help=f"agent API address (env MEDIC_URL; default {DEFAULT_URL})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_token_argument(parser) -> None:
    parser.add_argument(
        "--token-file",
        help="file holding the agent's admin token (default: MEDIC_TOKEN, MEDIC_TOKEN_FILE, ./medic-state/admin.token)",
    )


def admin_token(token_file: str | None) -> str:
    """The admin token from --token-file, MEDIC_TOKEN, MEDIC_TOKEN_FILE or ./medic-state/admin.token."""
    if not token_file and os.environ.get("MEDIC_TOKEN"):
        return os.environ["MEDIC_TOKEN"].strip()
    candidates = (
        [token_file] if token_file else [os.environ.get("MEDIC_TOKEN_FILE"), "medic-state/admin.token"]
    )
    for candidate in filter(None, candidates):
        try:
            with open(candidate, encoding="ascii") as handle:
                return handle.read().strip()
        except OSError as exc:
            if token_file:
                raise UsageError(f"cannot read the token file {candidate}: {exc.strerror}") from None
    raise UsageError(
        "this command needs the agent's admin token: pass --token-file (the agent's state_dir/admin.token "
        "or agent.token_file), or set MEDIC_TOKEN"
    )


def get_json(url: str, path: str, params: dict[str, Any] | None = None, timeout: float = 5.0) -> Any:
    return _request("GET", url, path, params=params, timeout=timeout)


def post_json(url: str, path: str, body: dict[str, Any], token: str, timeout: float = 30.0) -> Any:
    return _request(
        "POST", url, path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
    )


def _request(method: str, url: str, path: str, timeout: float, **kwargs: Any) -> Any:
    import httpx

    try:
        response = httpx.request(method, f"{url}{path}", timeout=timeout, **kwargs)
    except httpx.TimeoutException:
        raise AgentUnreachable(
            f"the agent at {url} did not answer within {timeout:.0f}s; is it overloaded?"
        ) from None
    except httpx.HTTPError as exc:
        raise AgentUnreachable(
            f"cannot reach the agent at {url} ({type(exc).__name__}); start it with `medic run`, "
            "or point --url / MEDIC_URL at it"
        ) from None
    try:
        body = response.json()
    except ValueError:
        raise ApiError(
            f"{url}{path} answered {response.status_code} with non-JSON content; is this medic?"
        ) from None
    if response.status_code >= 400:
        message = body.get("error") if isinstance(body, dict) else None
        raise ApiError(f"{message or response.reason_phrase} (HTTP {response.status_code})")
    return body
