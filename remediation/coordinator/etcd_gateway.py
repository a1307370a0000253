"""A small client for etcd's v3 JSON gateway (etcd 3.4+), over httpx: just what the coordinator needs.

Facts it relies on (verified against etcd 3.4.23, docs/remediation.md): paths under `/v3/`; keys
and values are base64; int64 fields (lease IDs, TTLs, revisions) come back as JSON strings; proto3
JSON omits defaults, so a failed txn has no `succeeded` key and an empty range no `kvs`; the
keepalive endpoint answers one message per request; the minimum lease TTL is 2 s; revoking an
unknown lease is a 404 with gRPC code 5.

Connection failures and timeouts try the next endpoint, then raise `CoordinatorUnavailable`;
an error answer raises `CoordinatorError` with etcd's message. A TLS failure says which side of the
handshake to fix (the CA bundle, the client certificate, the certificate's names).

With `auth` configured, `/v3/auth/authenticate` gives a token that goes in the `Authorization`
header of every request (set on the client, so a stream opened on it carries it too). When etcd
says the token is invalid (it expired, or the auth store changed), the gateway authenticates again
and retries once; a refused password is a `CoordinatorError` naming the user, never the password.
Through the gateway with `--client-cert-auth` and auth both on, etcd refuses any client certificate
that has a Common Name (HTTP 400, plain text): the error says to issue one without.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Sequence
from typing import Any

import httpx

from agent.core.bounded import AnswerTooLarge, AnswerTooSlow, read_bounded
from remediation.coordinator.etcd_security import EtcdSecurity
from remediation.errors import CoordinatorError, CoordinatorUnavailable

NOT_FOUND = 5  # gRPC NotFound, e.g. revoking an unknown lease
UNAUTHENTICATED = 16  # gRPC Unauthenticated: "etcdserver: invalid auth token" (expired or unknown)
TOKEN_REFUSALS = ("invalid auth token", "auth store is old", "user name is empty")
AUTH_NOT_ENABLED = "authentication is not enabled"
GATEWAY_CN_REFUSAL = "CommonName of client sending a request against gateway"
MAX_REPLY_BYTES = 32 * 2**20  # a range over medic's prefix is kilobytes; more is not etcd's answer
REPLY_DEADLINE_FACTOR = 3  # a whole answer within this many `timeout`s


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def answer_list(data: dict[str, Any], name: str) -> list[Any]:
    """An answer's list field (absent: empty); a `CoordinatorError` when it is something else."""
    value = data.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise CoordinatorError(f"etcd answered {name} that is not a list: {str(value)[:80]!r}")
    return value


def answer_int(data: Any, name: str) -> int:
    """An answer's integer field (etcd writes them as strings; absent: 0); a `CoordinatorError` else."""
    try:
        return int(data.get(name, 0) or 0)
    except (AttributeError, TypeError, ValueError):
        raise CoordinatorError(f"etcd answered a {name} that is not a number") from None


def answer_revision(data: dict[str, Any]) -> int:
    """The revision of an answer's header (0 when absent)."""
    return answer_int(data.get("header") or {}, "revision")


def prefix_end(prefix: str) -> str:
    """The `range_end` that covers every key starting with `prefix` (last byte + 1), base64."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return b64("\0")
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


class TokenRefused(CoordinatorError):
    """etcd no longer accepts the auth token (expired, or the auth store changed): authenticate again."""


class EtcdGateway:
    def __init__(
        self, endpoints: Sequence[str], timeout: float, security: EtcdSecurity | None = None
    ) -> None:
        if not endpoints:
            raise CoordinatorError("no etcd endpoints configured (remediation.coordinator.etcd.endpoints)")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        self.security = security or EtcdSecurity()
        plain = [e for e in self.endpoints if not e.startswith("https://")]
        if self.security.ssl_context is not None and plain:
            raise CoordinatorError(
                f"remediation.coordinator.etcd.tls is set but {', '.join(plain)} is not https://: "
                "use https:// endpoints with tls, or remove tls"
            )
        verify: ssl.SSLContext | bool = self.security.ssl_context or True
        # no connection is kept between requests: an idle kept-alive connection holds ~40 KiB of etcd's
        # memory per agent, more than everything the agent stores there (docs/deploy.md)
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout),
            trust_env=False,
            verify=verify,
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        self._preferred = 0
        self._auth_lock = threading.Lock()
        self._token: str | None = None  # None: not authenticated yet; "": etcd has auth disabled

    def close(self) -> None:
        self._client.close()

    def describe(self) -> str:
        """The endpoints and how medic talks to them (never a secret)."""
        security = self.security.describe()
        return ", ".join(self.endpoints) + (f" ({security})" if security else "")

    def call(self, path: str, body: dict[str, Any], *, missing_ok: bool = False) -> dict[str, Any]:
        """POST `body` to `/v3/<path>` on the first endpoint that answers, authenticated when configured."""
        if self.security.username is None:
            return self._post(path, body, missing_ok)
        if self._token is None:
            self.authenticate()
        try:
            return self._post(path, body, missing_ok)
        except TokenRefused:
            self.authenticate()
        try:
            return self._post(path, body, missing_ok)
        except TokenRefused as exc:
            raise CoordinatorError(
                f"etcd refused a fresh auth token for user {self.security.username}: {exc}; no restart "
                "until it is accepted: check the user's roles (`etcdctl user get`)"
            ) from None

    def authenticate(self) -> None:
        """Get a new token from `/v3/auth/authenticate` and send it from now on."""
        with self._auth_lock:
            self._client.headers.pop("Authorization", None)
            body = {"name": self.security.username, "password": self.security.password}
            try:
                data = self._post("auth/authenticate", body, False)
            except CoordinatorUnavailable:
                raise
            except CoordinatorError as exc:
                if AUTH_NOT_ENABLED in str(exc):
                    self._token = ""  # etcd lets everyone in; authenticate again if that changes
                    return
                raise CoordinatorError(
                    f"etcd authentication as user {self.security.username} failed: {_etcd_message(exc)}; "
                    "no restart until it succeeds: check remediation.coordinator.etcd.auth.username "
                    "and the password in auth.password_file"
                ) from None
            token = data.get("token")
            if not isinstance(token, str) or not token or len(token) > 4096 or not token.isprintable():
                raise CoordinatorError("etcd /v3/auth/authenticate answered without a usable token")
            self._token = token
            self._client.headers["Authorization"] = token

    def _post(self, path: str, body: dict[str, Any], missing_ok: bool) -> dict[str, Any]:
        problems = []
        count = len(self.endpoints)
        for i in range(count):
            index = (self._preferred + i) % count
            url = f"{self.endpoints[index]}/v3/{path}"
            try:
                with self._client.stream("POST", url, content=json.dumps(body)) as streamed:
                    raw = read_bounded(
                        streamed.iter_bytes(), MAX_REPLY_BYTES, REPLY_DEADLINE_FACTOR * self.timeout
                    )
                    response = httpx.Response(streamed.status_code, content=raw)
            except (httpx.TimeoutException, AnswerTooSlow):
                problems.append(f"{self.endpoints[index]}: no answer within {self.timeout:g}s")
                continue
            except AnswerTooLarge:
                problems.append(f"{self.endpoints[index]}: answered more than {MAX_REPLY_BYTES >> 20} MiB")
                continue
            except httpx.HTTPError as exc:
                problems.append(f"{self.endpoints[index]}: {self._transport_problem(exc)}")
                continue
            self._preferred = index
            return self._decode(response, path, missing_ok)
        raise CoordinatorUnavailable(
            f"etcd unreachable ({'; '.join(problems)}); no restart until it answers: check "
            "remediation.coordinator.etcd.endpoints and that etcd is up"
        )

    def _transport_problem(self, exc: httpx.HTTPError) -> str:
        """What failed, and for a TLS failure which setting to look at."""
        text = f"{exc.__class__.__name__}: {exc}"
        lowered = text.lower()
        if "certificate_verify_failed" in lowered or "certificate verify failed" in lowered:
            if "hostname" in lowered or "ip address mismatch" in lowered:
                return f"{text} (etcd's certificate does not name this endpoint's host)"
            return (
                f"{text} (etcd's certificate is not signed by a CA in "
                "remediation.coordinator.etcd.tls.ca_file)"
            )
        if "certificate required" in lowered or "bad certificate" in lowered or "unknown ca" in lowered:
            if not self.security.client_certificate:
                return f"{text} (etcd requires a client certificate: set tls.cert_file and tls.key_file)"
            return f"{text} (etcd does not accept medic's client certificate: is it signed by etcd's trusted CA?)"
        if "wrong version number" in lowered or "record layer failure" in lowered:
            return f"{text} (is this endpoint https://, and is etcd serving TLS on it?)"
        return text

    def _decode(self, response: httpx.Response, path: str, missing_ok: bool) -> dict[str, Any]:
        try:
            data = response.json()
        except (ValueError, RecursionError):
            if GATEWAY_CN_REFUSAL in response.text:
                raise CoordinatorError(
                    f"etcd /v3/{path}: etcd refuses, through its JSON gateway with auth on, a client "
                    "certificate that has a Common Name; issue medic's client certificate with an empty "
                    "subject (names in subjectAltName only) and authenticate with auth.username"
                ) from None
            raise CoordinatorError(
                f"etcd /v3/{path} answered HTTP {response.status_code} with non-JSON: {response.text[:200]!r}; "
                "is this an etcd 3.4+ client URL?"
            ) from None
        if not isinstance(data, dict):
            raise CoordinatorError(f"etcd /v3/{path} answered {type(data).__name__}, expected an object")
        if response.status_code >= 400 or "error" in data:
            if missing_ok and data.get("code") == NOT_FOUND:
                return {}
            message = str(data.get("message") or data.get("error") or response.text[:200])[:500]
            if (
                self.security.username is not None
                and path != "auth/authenticate"
                and (data.get("code") == UNAUTHENTICATED or any(r in message for r in TOKEN_REFUSALS))
            ):
                raise TokenRefused(message)
            if "user name is empty" in message or "permission denied" in message:
                message += (
                    " (etcd has auth on: set remediation.coordinator.etcd.auth, and grant the user "
                    "read/write on the key prefix)"
                )
            raise CoordinatorError(f"etcd /v3/{path} failed (HTTP {response.status_code}): {message}")
        return data

    # ----------------------------------------------------------------------------- kv
    def get(self, key: str) -> dict[str, Any] | None:
        data = self.call("kv/range", {"key": b64(key)})
        kvs = answer_list(data, "kvs")
        return self._kv(kvs[0]) if kvs else None

    @staticmethod
    def _kv(kv: Any) -> dict[str, Any]:
        """One key-value of an answer; a `CoordinatorError` when it is not of etcd's shape."""
        try:
            return {
                "key": unb64(kv.get("key", "")),
                "value": unb64(kv.get("value", "")),
                "create_revision": int(kv.get("create_revision", 0)),
                "mod_revision": int(kv.get("mod_revision", 0)),
                "lease": int(kv.get("lease", 0)),
            }
        except (AttributeError, TypeError, ValueError) as exc:  # base64, UTF-8 and int errors are ValueErrors
            raise CoordinatorError(f"etcd sent a key-value that is not etcd's ({exc})") from None

    @staticmethod
    def put_op(key: str, value: str, lease: int | None = None, ignore_lease: bool = False) -> dict[str, Any]:
        request: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            request["lease"] = str(lease)
        if ignore_lease:
            request["ignore_lease"] = True
        return {"request_put": request}

    @staticmethod
    def delete_op(key: str) -> dict[str, Any]:
        return {"request_delete_range": {"key": b64(key)}}

    @staticmethod
    def absent(key: str) -> dict[str, Any]:
        return {"target": "CREATE", "key": b64(key), "result": "EQUAL", "create_revision": "0"}

    @staticmethod
    def unchanged(key: str, mod_revision: int) -> dict[str, Any]:
        return {"target": "MOD", "key": b64(key), "result": "EQUAL", "mod_revision": str(mod_revision)}

    # ----------------------------------------------------------------------------- leases
    def grant(self, ttl: float) -> tuple[int, int]:
        data = self.call("lease/grant", {"TTL": str(max(2, round(ttl)))})
        lease, granted = answer_int(data, "ID"), answer_int(data, "TTL")
        if not lease:
            raise CoordinatorError(f"etcd granted no lease: {data}")
        return lease, granted

    def keepalive(self, lease: int) -> int:
        """The lease's renewed TTL in seconds; 0 when it no longer exists."""
        data = self.call("lease/keepalive", {"ID": str(lease)})
        return answer_int(data.get("result") or {}, "TTL")

    def revoke(self, lease: int) -> None:
        self.call("lease/revoke", {"ID": str(lease)}, missing_ok=True)


def _etcd_message(exc: CoordinatorError) -> str:
    """etcd's own words from a `CoordinatorError` raised by `_decode`."""
    text = str(exc)
    return text.split("): ", 1)[1] if "): " in text else text
