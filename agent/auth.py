"""The admin token that guards mutating endpoints (purge, restart, pause…).

The agent reads it from `agent.token_file`, or creates `state_dir/admin.token` (0600, 32 random
bytes, hex) on first start. Clients send `Authorization: Bearer <token>`; the comparison is constant
time. The CLI finds the token in `--token-file`, `MEDIC_TOKEN`, `MEDIC_TOKEN_FILE`, then
`./medic-state/admin.token`.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from fastapi import HTTPException, Request

from agent.errors import ConfigError

TOKEN_FILE_NAME = "admin.token"


def load_or_create_token(token_file: Path | None, state_dir: Path) -> tuple[str, Path]:
    """The token and the file it lives in; creates one in state_dir when none is configured."""
    path = token_file or Path(state_dir) / TOKEN_FILE_NAME
    if token_file is None and not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
    try:
        token = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"agent.token_file: cannot read {path}: {exc}") from None
    if len(token) < 16:
        raise ConfigError(
            f"agent.token_file: {path} holds a token shorter than 16 characters; use a longer one"
        )
    if path.stat().st_mode & 0o077:
        raise ConfigError(f"agent.token_file: {path} is readable by others; run `chmod 600 {path}`")
    return token, path


class TokenGuard:
    """A FastAPI dependency: 401 without a bearer token, 403 with a wrong one."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    def __call__(self, request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise HTTPException(
                401,
                "this endpoint needs the admin token: send `Authorization: Bearer <token>` (see agent.token_file)",
            )
        if not hmac.compare_digest(given.strip().encode(), self._token):
            raise HTTPException(403, "wrong admin token")
