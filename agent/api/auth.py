"""The admin token that guards mutating endpoints (purge, restart, pause…).

The agent reads it from `agent.token_file`, or creates `state_dir/admin.token` (0600, 32 random
bytes, hex) on first start. Clients send `Authorization: Bearer <token>`; the comparison is constant
time. The CLI finds the token in `--token-file`, `MEDIC_TOKEN`, `MEDIC_TOKEN_FILE`, then
`./medic-state/admin.token`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from fastapi import HTTPException, Request

from agent.state import TOKEN_FILE_NAME
from probes.linux.fstrust import create_exclusive, ensure_private_dir
from probes.linux.secrets import read_token

MIN_TOKEN_CHARS = 16  # whoever guesses it can restart instances


def load_or_create_token(token_file: Path | None, state_dir: Path) -> tuple[str, Path]:
    """The token and the file it lives in; creates one in state_dir when none is configured.

    Whoever can read the token can pause remediation and restart instances, and whoever can write
    it chooses the token: the file must be a regular file (never a symlink), owned by medic's user
    (a configured one: or root) with no group/other permission, in a directory no other user can
    change. Anything else is refused (`UnsafePath`) with the command that fixes it.
    """
    if token_file is None:
        directory = ensure_private_dir(state_dir, "state_dir")
        path = directory / TOKEN_FILE_NAME
        create_exclusive(path, (secrets.token_hex(32) + "\n").encode("ascii"), 0o600)
        return read_token(path, "admin token", MIN_TOKEN_CHARS, owners={os.geteuid()}), path
    path = Path(token_file)
    return read_token(path, "agent.token_file", MIN_TOKEN_CHARS), path


class TokenGuard:
    """The admin-token check: 401 without a bearer token, 403 with a wrong one.

    A FastAPI dependency returning the caller's identity (`token:<8 hex of its sha256>`), the `by`
    of the audit trail. `agent.api.guard.HttpGuard` runs `check` before the body is read; the
    dependency runs it again for apps built without the guard.
    """

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self.identity = "token:" + hashlib.sha256(self._token).hexdigest()[:8]

    def check(self, header: str) -> tuple[int, str] | None:
        """None when `header` (the Authorization value) carries the token, else (status, message)."""
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return (
                401,
                "this endpoint needs the admin token: send `Authorization: Bearer <token>` (see agent.token_file)",
            )
        if not hmac.compare_digest(given.strip().encode("utf-8", "replace"), self._token):
            return 403, "wrong admin token"
        return None

    def __call__(self, request: Request) -> str:
        refused = self.check(request.headers.get("authorization", ""))
        if refused is not None:
            raise HTTPException(*refused)
        return self.identity
