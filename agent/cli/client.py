"""The CLI's view of a running agent: GET/POST JSON with one clear error when it cannot be reached."""

from __future__ import annotations

import os
from typing import Any

from agent.errors import AgentUnreachable, ApiError

DEFAULT_URL = "http://127.0.0.1:9464"


def agent_url(explicit: str | None) -> str:
    return (explicit or os.environ.get("MEDIC_URL") or DEFAULT_URL).rstrip("/")


def add_url_argument(parser) -> None:
    parser.add_argument("--url", help=f"agent API address (env MEDIC_URL; default {DEFAULT_URL})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def get_json(url: str, path: str, params: dict[str, Any] | None = None, timeout: float = 5.0) -> Any:
    import httpx

    try:
        response = httpx.get(f"{url}{path}", params=params, timeout=timeout)
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
