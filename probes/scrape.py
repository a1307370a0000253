"""Bounded HTTP requests for the latency probes and the warm-up gate, with errors that say what to do.

`fetch()` sends one request with the sync `httpx` client (the probes run in worker threads) and
enforces a *total* deadline and a size cap: httpx's timeouts apply to each network operation, so
a server that trickles one byte a second would otherwise hold a probe forever. Every failure
becomes a `ProbeError` whose message names the URL, what happened and which setting to check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from agent.core.errors import ProbeError

MAX_BODY = 64 * 2**20  # a /metrics page larger than this is refused, not read into memory


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: httpx.Headers
    body: bytes
    elapsed: float  # seconds from sending the request to the last byte of the answer


def new_client() -> httpx.Client:
    """A client without redirects, proxies from the environment or cookies: a probe talks to one URL."""
    return httpx.Client(follow_redirects=False, trust_env=False)


def fetch(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    timeout: float,
    setting: str,
    headers: dict[str, str] | None = None,
    content: bytes | None = None,
    max_body: int = MAX_BODY,
) -> Reply:
    """Send one request and read its whole answer within `timeout` seconds in total.

    `setting` names the config key a user should check (`latency.prometheus.url`); it goes into
    the error messages. Any HTTP status is returned: what counts as success is the caller's call.
    """
    started = time.perf_counter()
    deadline = started + timeout
    try:
        with client.stream(
            method, url, headers=headers, content=content, timeout=httpx.Timeout(timeout)
        ) as response:
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():  # as each read returns, so a drip meets the deadline
                size += len(chunk)
                if size > max_body:
                    raise ProbeError(
                        f"{url} answered more than {max_body // 2**20} MiB; medic stops reading there "
                        f"(check {setting})"
                    )
                chunks.append(chunk)
                if time.perf_counter() > deadline:
                    raise httpx.ReadTimeout("total deadline passed")
            elapsed = time.perf_counter() - started
            return Reply(response.status_code, response.headers, b"".join(chunks), elapsed)
    except httpx.TimeoutException:
        raise ProbeError(
            f"{url} did not answer within {timeout:g}s (hung or overloaded?); "
            f"check the server, or raise {_timeout_key(setting)}"
        ) from None
    except httpx.ConnectError as exc:
        raise ProbeError(
            f"cannot connect to {url}: {_reason(exc)}; is the server up and listening there? (check {setting})"
        ) from None
    except httpx.RemoteProtocolError as exc:
        raise ProbeError(
            f"{url} closed the connection without a complete answer ({_reason(exc)}); "
            "the server crashed or is not speaking HTTP"
        ) from None
    except httpx.DecodingError as exc:
        raise ProbeError(f"{url} sent a body that cannot be decoded ({_reason(exc)})") from None
    except httpx.HTTPError as exc:
        raise ProbeError(f"request to {url} failed: {type(exc).__name__}: {_reason(exc)}") from None
    except (httpx.InvalidURL, ValueError) as exc:  # a URL or a header httpx cannot send
        raise ProbeError(f"cannot send a request to {url}: {_reason(exc)}; check {setting}") from None


def _timeout_key(setting: str) -> str:
    return setting.rsplit(".", 1)[0] + ".timeout" if "." in setting else "its timeout"


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
