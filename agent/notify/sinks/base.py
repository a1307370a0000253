"""What every sink shares: one HTTP client, and the rule that tells a retry from a dead letter.

A sink renders a `Notification` into one HTTP request at delivery time and sends it. Transport
errors, timeouts, 408, 429 and 5xx are worth retrying; any other 4xx means the request itself is
wrong (bad URL, bad credentials, a payload the target refuses), so retrying cannot help. A 429 or
503 may say when to come back (`Retry-After`: Slack rate-limits each webhook and says so); the
error carries that wait, so the outbox does not knock again sooner.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, ClassVar, Literal

from agent import __version__
from agent.core.bounded import bounded_request
from agent.notify.config import CommonSinkSpec
from agent.notify.event_alerts import canonical
from agent.notify.model import Notification

if TYPE_CHECKING:
    import httpx

Takes = Literal["alerts", "messages"]
_RETRYABLE = {408, 425, 429}
_SAYS_WHEN = {429, 503}  # the answers that may carry a Retry-After worth obeying
MAX_RETRY_AFTER = 3600.0  # a target asking for more is capped: an hour later it is asked again


class DeliveryError(Exception):
    """One failed attempt: `retryable` says whether another attempt may succeed, `retry_after`
    how many seconds the target asked to be left alone (None: it did not say)."""

    def __init__(self, detail: str, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.retryable = retryable
        self.retry_after = retry_after


MAX_ANSWER_BYTES = 2**20  # a receiver's answer is an acknowledgement: a short JSON or text
ANSWER_DEADLINE_FACTOR = 3  # the whole answer within this many `timeout`s
_BODY_HEADERS = {
    "content-encoding",
    "content-length",
    "transfer-encoding",
}  # of the body as sent, not as read


@dataclass(frozen=True, slots=True)
class Request:
    url: str
    body: bytes
    headers: dict[str, str]


class HttpSink:
    type: ClassVar[str] = ""
    takes: ClassVar[Takes] = "messages"  # alerts: fire/resolve/once effects; messages: one per event

    def __init__(
        self, name: str, spec: CommonSinkSpec, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        import httpx  # loaded with the first sink: an agent without one does not carry it

        self.name = name
        self.spec = spec
        self.client = httpx.Client(
            timeout=spec.timeout,
            follow_redirects=False,
            transport=transport,
            headers={"User-Agent": f"sidecar-medic/{__version__}"},
        )

    @property
    def min_severity(self) -> str | None:
        return self.spec.min_severity

    def wants(self, kind: str) -> bool:
        """Whether the sink's `kinds` filter lets this event kind through (aliases count as their canonical kind)."""
        kinds = self.spec.kinds
        if kinds is None:
            return True
        return canonical(kind) in {canonical(k) for k in kinds}

    def render(self, note: Notification, delivery_id: int, now: float) -> Request:
        raise NotImplementedError

    def send(self, note: Notification, delivery_id: int, now: float) -> None:
        """Deliver one notification; raises `DeliveryError`."""
        request = self.render(note, delivery_id, now)
        self.post(request)

    def post(self, request: Request) -> httpx.Response:
        import httpx

        headers = {"Content-Type": "application/json", **request.headers}
        try:  # the answer within a bound and a total deadline: a dripping receiver would hold the outbox
            response: httpx.Response = bounded_request(
                self.client,
                "POST",
                request.url,
                max_bytes=MAX_ANSWER_BYTES,
                seconds=ANSWER_DEADLINE_FACTOR * self.spec.timeout,
                content=request.body,
                headers=headers,
            )
        except httpx.TimeoutException:
            raise DeliveryError(f"{request.url} did not answer within {self.spec.timeout:g}s", True) from None
        except httpx.HTTPError as exc:
            raise DeliveryError(f"cannot reach {request.url}: {type(exc).__name__}: {exc}", True) from None
        check(response)
        return response

    def close(self) -> None:
        self.client.close()


def check(response: httpx.Response) -> None:
    """Raise `DeliveryError` for a non-2xx answer, retryable or not."""
    code = response.status_code
    if 200 <= code < 300:
        return
    excerpt = response.text[:200].strip().replace("\n", " ")
    retryable = code >= 500 or code in _RETRYABLE
    hint = "" if retryable else " (not retried: fix the sink's URL, credentials or the target's config)"
    wait = retry_after(response.headers.get("retry-after"), time.time()) if code in _SAYS_WHEN else None
    if wait is not None:
        hint = f" (asked to wait {wait:g}s)"
    raise DeliveryError(
        f"{response.request.url} answered {code}: {excerpt or response.reason_phrase}{hint}", retryable, wait
    )


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds a `Retry-After` header asks for (delay-seconds or an HTTP date), within [0, an hour];
    None when missing or unreadable, so that the normal backoff applies."""
    value = (value or "").strip()
    if re.fullmatch(r"[0-9]+", value):
        seconds = float(value)  # no size limit: a huge number becomes inf, then the cap
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # "-0000": UTC without saying where the sender is
            when = when.replace(tzinfo=timezone.utc)
        seconds = when.timestamp() - now
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)
