"""The warm-up gate: replay requests to a fresh instance until it answers fast enough, or give up.

A restarted inference server is slow until its caches, JIT and lazily loaded weights are warm.
`replay_until_warm(requests, base_url, target=…, consecutive=K, deadline=…)` sends the requests
one at a time, round robin, and returns a `WarmupOutcome` as soon as K requests in a row
answered 2xx within `target` seconds (warm), or when the deadline passes (not warm: the reason
says why). A failed request breaks the streak and backs off (0.1 s doubling to 2 s) so that a
server still starting is not hammered. The remediation engine holds its fleet slot on this
gate (`warmup_gate`, installed by the agent for instances with `verify.warmup`); `medic warmup NAME
--requests DIR` runs it by hand.

Request files (`load_requests(DIR)`: every regular, non-hidden file, in name order):
- `*.http`: an HTTP request as text: `METHOD TARGET [HTTP/1.1]`, header lines `Name: value`, a
  blank line, then the body. TARGET is a path (joined to the base URL) or an absolute URL.
  Lines starting with `#` before the request line are comments.
- any other file: a body POSTed to the base URL itself (`Content-Type: application/json` for
  `*.json`, else `application/octet-stream`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from agent.config.model import LatencySpec
from agent.core.errors import ConfigError, ProbeError
from remediation.config import WarmupSection
from remediation.model import Decision, InstanceView

if TYPE_CHECKING:
    import httpx

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
MAX_REQUEST_FILE = 16 * 2**20


@dataclass(frozen=True, slots=True)
class WarmupRequest:
    source: str  # the file it came from
    method: str
    target: str  # "" (the base URL itself), a path, or an absolute URL
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None

    def url(self, base_url: str) -> str:
        return urljoin(base_url, self.target) if self.target else base_url


@dataclass(slots=True)
class WarmupOutcome:
    warm: bool
    reason: str
    requests: int = 0
    failures: int = 0
    streak: int = 0  # requests in a row within the target at the end
    best_streak: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds, of the requests that answered
    last_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "warm": self.warm,
            "reason": self.reason,
            "requests": self.requests,
            "failures": self.failures,
            "streak": self.streak,
            "best_streak": self.best_streak,
            "elapsed_seconds": self.elapsed,
            "latencies_seconds": self.latencies,
            "last_error": self.last_error,
        }


def parse_http_request(text: str, source: str = "<request>") -> WarmupRequest:
    """A request from `.http` text; `ConfigError` names the file, the line and the expected form."""
    lines = text.split("\n")
    index = 0
    while index < len(lines) and (not lines[index].strip() or lines[index].lstrip().startswith("#")):
        index += 1
    if index == len(lines):
        raise ConfigError(f"{source}: no request line; expected `METHOD TARGET` such as `POST /v1/predict`")
    parts = lines[index].strip().split()
    if (
        len(parts) not in (2, 3)
        or parts[0].upper() not in METHODS
        or (len(parts) == 3 and not parts[2].startswith("HTTP/"))
    ):
        raise ConfigError(
            f"{source}:{index + 1}: expected `METHOD TARGET [HTTP/1.1]` with METHOD one of {', '.join(METHODS)}, "
            f"got {lines[index].strip()[:80]!r}"
        )
    method, target = parts[0].upper(), parts[1]
    if not (target.startswith("/") or target.startswith(("http://", "https://"))):
        raise ConfigError(
            f"{source}:{index + 1}: the target must be a path (/v1/predict) or an http(s) URL, got {target!r}"
        )
    headers: dict[str, str] = {}
    index += 1
    while index < len(lines) and lines[index].strip():
        name, sep, value = lines[index].partition(":")
        if not sep or not name.strip() or any(c in name for c in " \t"):
            raise ConfigError(
                f"{source}:{index + 1}: expected a header line `Name: value`, got {lines[index][:80]!r}"
            )
        headers[name.strip()] = value.strip()
        index += 1
    body = "\n".join(lines[index + 1 :]) if index < len(lines) else ""
    return WarmupRequest(source, method, target, headers, body.encode() if body else None)


def load_requests(directory: str | Path) -> list[WarmupRequest]:
    """Every request file of `directory`, in name order; `ConfigError` when there is none or one is bad."""
    path = Path(directory)
    if not path.is_dir():
        raise ConfigError(f"{path}: not a directory of request files (see `medic warmup --help`)")
    requests = []
    for file in sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")):
        try:
            data = file.read_bytes()[: MAX_REQUEST_FILE + 1]
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read: {exc.strerror}") from None
        if len(data) > MAX_REQUEST_FILE:
            raise ConfigError(f"{file}: larger than {MAX_REQUEST_FILE // 2**20} MiB")
        if file.suffix == ".http":
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise ConfigError(f"{file}: an .http request file must be UTF-8 text") from None
            requests.append(parse_http_request(text, str(file)))
        else:
            kind = "application/json" if file.suffix == ".json" else "application/octet-stream"
            requests.append(WarmupRequest(str(file), "POST", "", {"Content-Type": kind}, data))
    if not requests:
        raise ConfigError(f"{path}: no request files (.http requests or bodies to POST)")
    return requests


def replay_until_warm(
    requests: Sequence[WarmupRequest],
    base_url: str,
    *,
    target: float,
    consecutive: int = 5,
    deadline: float = 120.0,
    timeout: float = 5.0,
    client: httpx.Client | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_request: Callable[[WarmupRequest, float | None, str | None], None] | None = None,
) -> WarmupOutcome:
    """Replay `requests` round robin until `consecutive` answer 2xx within `target` seconds in a row."""
    if not requests:
        raise ValueError("replay_until_warm needs at least one request")
    if consecutive < 1 or target <= 0 or deadline <= 0:
        raise ValueError("consecutive must be >= 1, target and deadline > 0")
    from probes.scrape import new_client  # httpx loads with the first warm-up, not with the agent

    own = client is None
    client = client or new_client()
    started = clock()
    outcome = WarmupOutcome(False, "")
    backoff = 0.1
    try:
        while outcome.streak < consecutive:
            left = deadline - (clock() - started)
            if left <= 0:
                break
            request = requests[outcome.requests % len(requests)]
            latency, error = _send(client, request, base_url, min(timeout, max(left, 0.01)))
            outcome.requests += 1
            if on_request is not None:
                on_request(request, latency, error)
            if latency is not None:
                outcome.latencies.append(latency)
            if error is not None:
                outcome.failures += 1
                outcome.last_error = error
                outcome.streak = 0
                sleep(min(backoff, max(0.0, deadline - (clock() - started))))
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            outcome.streak = outcome.streak + 1 if latency is not None and latency <= target else 0
            outcome.best_streak = max(outcome.best_streak, outcome.streak)
    finally:
        if own:
            client.close()
    outcome.elapsed = clock() - started
    outcome.warm = outcome.streak >= consecutive
    outcome.reason = _reason(outcome, target, consecutive, deadline)
    return outcome


def _send(
    client: httpx.Client, request: WarmupRequest, base_url: str, timeout: float
) -> tuple[float | None, str | None]:
    """(latency, error) of one request; error is None on a 2xx answer."""
    from probes.scrape import fetch

    url = request.url(base_url)
    try:
        reply = fetch(
            client,
            request.method,
            url,
            timeout=timeout,
            setting="the warm-up URL",
            headers=request.headers,
            content=request.body,
        )
    except ProbeError as exc:
        return None, str(exc)
    if not 200 <= reply.status < 300:
        return (
            reply.elapsed,
            f"{request.method} {url} answered HTTP {reply.status} ({Path(request.source).name})",
        )
    return reply.elapsed, None


def _reason(outcome: WarmupOutcome, target: float, consecutive: int, deadline: float) -> str:
    limit = f"{target * 1000:.0f}ms" if target < 1 else f"{target:g}s"
    if outcome.warm:
        return (
            f"warm: {consecutive} requests in a row answered within {limit} "
            f"after {outcome.requests} requests in {outcome.elapsed:.1f}s"
        )
    why = (
        f"not warm within {deadline:g}s: {outcome.requests} requests, at most {outcome.best_streak} in a row "
        f"within {limit} ({consecutive} needed)"
    )
    if outcome.failures:
        why += f"; {outcome.failures} failed, the last: {outcome.last_error}"
    elif outcome.latencies:
        why += f"; the last answered in {outcome.latencies[-1] * 1000:.0f}ms"
    return why


# ----------------------------------------------------------------------------- the gate in the loop
def latency_defaults(latency: LatencySpec | None) -> tuple[str | None, float | None]:
    """The base URL and the latency target an instance's `latency:` section implies: its canary URL,
    else the origin of its Prometheus URL; the threshold of its SLO."""
    if latency is None:
        return None, None
    url = None
    if latency.canary is not None:
        url = str(latency.canary.url)
    elif latency.prometheus is not None:
        parts = urlsplit(str(latency.prometheus.url))
        url = f"{parts.scheme}://{parts.netloc}/"
    target = float(latency.slo.threshold) if latency.slo is not None else None
    return url, target


def warmup_gate(
    settings_for: Callable[[str], WarmupSection | None],
    latency_for: Callable[[str], LatencySpec | None],
    clock: Callable[[], float] = time.time,
) -> Callable[[InstanceView, float], Decision]:
    """The engine's `warmup_gate(view, deadline)`: replay the instance's `verify.warmup.requests` to the
    new process until it is warm, within `verify.warmup.deadline` and the verification's own deadline.

    `settings_for(name)` gives the instance's `WarmupSection` (None: no warm-up), `latency_for(name)`
    its `latency:` section (the URL and target when the warm-up section names none).
    """

    def gate(view: InstanceView, deadline: float) -> Decision:
        spec = settings_for(view.name)
        if spec is None:
            return Decision.allow("warmup", "no warm-up configured", code="none")
        default_url, default_target = latency_for_safe(view.name)
        url, target = spec.url or default_url, spec.target or default_target
        if url is None or target is None:
            missing = "a URL (verify.warmup.url or latency.canary.url)" if url is None else ""
            if target is None:
                missing += (" and " if missing else "") + "a target (verify.warmup.target or latency.slo)"
            return Decision.block("warmup", "misconfigured", f"cannot warm {view.name} up: no {missing}")
        try:
            requests = load_requests(spec.requests)
        except ConfigError as exc:
            return Decision.block("warmup", "misconfigured", f"cannot warm {view.name} up: {exc}")
        budget = min(spec.deadline, deadline - clock())
        if budget <= 0:
            return Decision.block("warmup", "not-warm", "no time left for the warm-up within verify.timeout")
        outcome = replay_until_warm(
            requests, url, target=target, consecutive=spec.consecutive, deadline=budget, timeout=spec.timeout
        )
        return Decision(
            outcome.warm,
            "warmup",
            "warm" if outcome.warm else "not-warm",
            outcome.reason,
            None,
            {
                "url": url,
                "target_seconds": target,
                "consecutive": spec.consecutive,
                "requests": outcome.requests,
                "failures": outcome.failures,
                "best_streak": outcome.best_streak,
                "elapsed_seconds": round(outcome.elapsed, 3),
            },
        )

    def latency_for_safe(name: str) -> tuple[str | None, float | None]:
        try:
            return latency_defaults(latency_for(name))
        except (AttributeError, TypeError, ValueError):
            return None, None

    return gate
