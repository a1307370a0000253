"""The CLI's view of a running agent: where it is, its admin token, and GET/POST JSON with one clear
error when it cannot be reached.

The address and the token come from the flags, then the environment, then the agent's state
directory (`--state-dir` or MEDIC_STATE_DIR: `agent.json` says where it listens, `admin.token` holds
the token). Both files are read as secrets: `agent.json` decides where the token is sent.

The admin token goes to a loopback address only when the socket listening there belongs to root,
to the CLI's user or to the owner of the agent's state directory or token file (`/proc/net/tcp`
says who): while the agent is down, any local user could bind its port and collect the token. A
non-loopback address is not checked here; TLS (`https://`) and the network are the operator's there.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent.core.bounded import AnswerTooLarge, AnswerTooSlow, read_bounded
from agent.core.errors import AgentUnreachable, ApiError, ProbeError, UnsafePath, UsageError
from agent.state import AGENT_FILE_NAME, TOKEN_FILE_NAME
from probes.linux.fstrust import read_private_file
from probes.linux.nettcp import read_tcp_listeners
from probes.linux.secrets import read_token

DEFAULT_URL = "http://127.0.0.1:9464"
DEFAULT_STATE_DIR = "medic-state"
MAX_REPLY_BYTES = 128 * 2**20  # the largest answer: a 16 MiB evidence item, JSON-escaped
REPLY_DEADLINE_FACTOR = 3  # a whole answer within this many times the per-read timeout
replies_received = 0  # JSON objects the agent answered in this process: see `agent.cli.main`
agent_owners: set[int] = set()  # owners of the state dir and token file this process read

ApiReply = dict[str, Any]
"""A JSON object the agent answered: its fields are the API's (docs/api.md), read where rendered."""


def state_dir(explicit: str | None) -> str | None:
    """The state directory the user named (--state-dir, else MEDIC_STATE_DIR), or None."""
    return explicit or os.environ.get("MEDIC_STATE_DIR") or None


def agent_url(explicit: str | None, state: str | None = None) -> str:
    """The agent's API address from --url, MEDIC_URL, STATE_DIR/agent.json or the default; a malformed
    one is a usage error, not an unreachable agent."""
    url = explicit or os.environ.get("MEDIC_URL")
    source = "--url" if explicit else "MEDIC_URL"
    directory = state_dir(state)
    if directory:
        _note_owner(Path(directory))
    if not url and directory:
        url, source = _url_from_state(Path(directory) / AGENT_FILE_NAME), f"{directory}/{AGENT_FILE_NAME}"
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
    url: str = info["url"]
    return url


def admin_token(token_file: str | None, state: str | None = None) -> str:
    """The admin token from --token-file, MEDIC_TOKEN, MEDIC_TOKEN_FILE or STATE_DIR/admin.token
    (default ./medic-state/admin.token); a file others may read is refused with the chmod that fixes it."""
    if not token_file and os.environ.get("MEDIC_TOKEN"):
        return os.environ["MEDIC_TOKEN"].strip()
    default = Path(state_dir(state) or DEFAULT_STATE_DIR) / TOKEN_FILE_NAME
    if token_file:
        _note_owner(Path(token_file))
        return read_token(Path(token_file), "--token-file")
    candidates = [("MEDIC_TOKEN_FILE", os.environ.get("MEDIC_TOKEN_FILE")), ("the token file", str(default))]
    for where, candidate in candidates:
        if candidate and Path(candidate).exists():  # the implicit places may hold none
            token = read_token(Path(candidate), where)
            _note_owner(Path(candidate))
            return token
    raise UsageError(
        "this command needs the agent's admin token: pass --state-dir (the agent's state_dir), "
        "--token-file (its admin.token or agent.token_file), or set MEDIC_TOKEN"
    )


def _note_owner(path: Path) -> None:
    """Remember who owns the agent's state dir or token file: the agent's user may listen for it."""
    try:
        agent_owners.add(os.stat(path).st_uid)
    except OSError:
        pass  # a missing file is refused by whoever reads it


def _loopback_host(host: str) -> bool:
    """Whether `host` (a literal or a name) is this machine's loopback, where any local user may listen."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        if host == "localhost" or host.endswith(".localhost"):
            return True
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            return False  # the request itself says it cannot reach the name
        return any(_loopback_host(str(info[4][0])) for info in infos)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address.is_loopback


def _may_receive(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a socket bound to `address` answers a connection to loopback (loopback or wildcard)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def check_token_recipient(url: str) -> None:
    """Refuse (`UnsafePath`) to send the admin token to a loopback `url` unless every socket that
    listens there belongs to root, the CLI's user or the agent's (state dir or token file owner);
    nothing listening is an unreachable agent. Unverifiable (no /proc/net/tcp) is refused too."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not _loopback_host(host):
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    where = f"{host}:{port}"
    allowed = {0, os.geteuid(), *agent_owners}
    try:
        listeners = [
            sock for sock in read_tcp_listeners() if sock.port == port and _may_receive(sock.address)
        ]
    except (OSError, ProbeError) as exc:
        raise UnsafePath(
            f"cannot tell who listens at {where} ({exc}), so the admin token is not sent: "
            "medic sends it to a loopback address only when /proc/net/tcp shows the agent's user listening"
        ) from None
    if not listeners:
        raise AgentUnreachable(
            f"nothing listens at {where}; start the agent with `medic run`, "
            "or point --url / MEDIC_URL / --state-dir at it"
        )
    strangers = sorted({sock.uid for sock in listeners} - allowed)
    if strangers:
        expected = ", ".join(f"uid {uid}" for uid in sorted(allowed))
        raise UnsafePath(
            f"the socket listening at {where} belongs to uid {strangers[0]}, not to the agent's user "
            f"({expected}), so the admin token is not sent: is the agent down or on another port? "
            f"check `ss -ltnpe 'sport = :{port}'` and the url in the state dir's agent.json"
        )


def get_json(url: str, path: str, params: dict[str, Any] | None = None, timeout: float = 5.0) -> ApiReply:
    return _request("GET", url, path, params=params, timeout=timeout)


def post_json(url: str, path: str, body: dict[str, Any], token: str, timeout: float = 30.0) -> ApiReply:
    """POST with the admin token, to a loopback listener only when it is the agent's user's."""
    check_token_recipient(url)
    return _request(
        "POST", url, path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
    )


def _request(method: str, url: str, path: str, timeout: float, **kwargs: Any) -> ApiReply:
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
