"""The `notify:` section of medic's config: where notifications go and how alerts come in.

    notify:
      min_severity: warning              # findings below this are not sent (restarts etc. always are)
      dashboard_url: "https://grafana.example/d/medic?var-name={instance}"   # else agent.external_url's
      runbook_url: "https://docs.example/medic/runbooks.md#{alertname}"     # the anchor: the name in lower case
      sinks:
        - {type: alertmanager, url: "http://127.0.0.1:9093"}
        - {type: webhook, url: "https://hooks.example/medic", secret_env: MEDIC_WEBHOOK_SECRET}
        - {type: slack, url_env: SLACK_WEBHOOK_URL}
      retry: {base: 2s, cap: 5m, max_attempts: 20}
      receiver: {instance_labels: [instance, name], secret_env: MEDIC_RECEIVER_SECRET}

A plain list is accepted as shorthand for `sinks:` (`notify: [{type: alertmanager, url: ...}]`).
This module imports only the ground (`agent.core`) and the file-trust reads (`probes.linux`), so
`agent.config.model` can import it without a cycle.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from agent.core.errors import ConfigError
from agent.core.types import DAY, HOUR, Duration, Severity, Size, Strict, size_within, within
from agent.notify.event_alerts import ROUTES, canonical
from probes.linux.secrets import read_token

SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "error": 2, "critical": 3}
RUNBOOK_URL = "https://medic.example.internal/docs/runbooks.md#{alertname}"
_SINK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
    return value.rstrip("/") if parts.path in ("", "/") else value


HttpUrl = Annotated[str, AfterValidator(_http_url)]


class RetrySpec(Strict):
    """Exponential backoff: attempt n waits min(cap, base·2^(n-1)), shortened by up to `jitter` of itself."""

    base: Annotated[Duration, within(0.01, HOUR)] = 2.0
    cap: Annotated[Duration, within(0.01, DAY)] = 300.0
    max_attempts: int = Field(20, ge=1, le=1000)  # then a dead letter; the defaults retry for about an hour
    jitter: float = Field(0.2, ge=0.0, le=1.0)


MIN_SECRET_CHARS = 16  # an HMAC key or a bearer token shorter than this is guessable


class _Secret(Strict):
    """A secret named by an environment variable or a file (0600), never written in the config itself."""

    secret_env: str | None = None
    secret_file: Path | None = None

    def secret(self, where: str) -> str | None:
        """The secret's value; `ConfigError` saying what to do when it is configured but unreadable."""
        if self.secret_env:
            value = os.environ.get(self.secret_env, "").strip()
            if not value:
                raise ConfigError(
                    f"{where}.secret_env: the environment variable {self.secret_env} is not set"
                )
            return value
        if self.secret_file:
            return read_token(self.secret_file, f"{where}.secret_file", MIN_SECRET_CHARS)
        return None


class CommonSinkSpec(Strict):
    """What every sink's settings have, whatever its target."""

    name: str | None = None  # default: the type, with its index when several share it
    min_severity: Severity | None = None  # overrides notify.min_severity for this sink
    kinds: list[str] | None = None  # only these event kinds (see docs/alerts.md); default: all routed kinds
    timeout: Annotated[Duration, within(0.05, 120)] = 5.0

    @model_validator(mode="after")
    def _check_name_and_kinds(self) -> CommonSinkSpec:
        if self.name is not None and not _SINK_NAME.match(self.name):
            raise ValueError(f"name: expected letters, digits, '.', '_' or '-', got {self.name!r}")
        if self.kinds is not None:
            unknown = [k for k in self.kinds if canonical(k) not in ROUTES]
            if unknown:
                raise ValueError(
                    f"kinds: unknown event kind(s) {', '.join(unknown)}; routed kinds: {', '.join(sorted(ROUTES))}"
                )
        return self


class AlertmanagerSinkSpec(CommonSinkSpec):
    """Posts alerts to `POST /api/v2/alerts`, re-posts them while active, and holds silences.

    `urls` lists the replicas of one highly available Alertmanager: every alert goes to each of
    them (as Prometheus does; they deduplicate), each with its own outbox queue, and silences go
    to the first that answers (the replicas gossip them to each other)."""

    type: Literal["alertmanager"]
    url: HttpUrl | None = None  # the Alertmanager base URL, e.g. http://127.0.0.1:9093
    urls: list[HttpUrl] | None = Field(None, min_length=1, max_length=16)  # or: its HA replicas
    repost_interval: Annotated[Duration, within(0.2, HOUR)] = 60.0  # endsAt = last post + 4 x this
    silences: bool = True  # silence an instance's firing alerts while medic remediates it
    silence_max: Annotated[Duration, within(1, 7 * DAY)] = 1800.0  # when the caller gives no expiry
    silence_refresh: Annotated[Duration, within(0.1, 600)] = 5.0  # look for new alerts to silence
    bearer_token_file: Path | None = None

    @model_validator(mode="after")
    def _one_url_form(self) -> AlertmanagerSinkSpec:
        if (self.url is None) == (self.urls is None):
            raise ValueError("give url (one Alertmanager) or urls (the replicas of an HA one), not both")
        if self.urls is not None and len(set(self.urls)) != len(self.urls):
            raise ValueError("urls: a replica is listed twice")
        return self

    @property
    def replicas(self) -> list[str]:
        """The base URL of each replica (one for the `url` form)."""
        return list(self.urls) if self.urls is not None else [self.url or ""]


class WebhookSinkSpec(CommonSinkSpec, _Secret):
    """Generic JSON (schema version 1), signed with HMAC-SHA256 over `timestamp.body`."""

    type: Literal["webhook"]
    url: HttpUrl
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_secret(self) -> WebhookSinkSpec:
        if (self.secret_env is None) == (self.secret_file is None):
            raise ValueError("give exactly one of secret_env or secret_file: webhooks are always signed")
        return self


class SlackSinkSpec(CommonSinkSpec):
    """A Slack-compatible incoming webhook (also Mattermost, Rocket.Chat)."""

    type: Literal["slack"]
    url: HttpUrl | None = None
    url_env: str | None = None  # the webhook URL is a secret: prefer naming an environment variable

    @model_validator(mode="after")
    def _one_url(self) -> SlackSinkSpec:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of url or url_env")
        return self

    def resolved_url(self, where: str) -> str:
        if self.url is not None:
            return self.url
        value = os.environ.get(self.url_env or "", "").strip()
        if not value:
            raise ConfigError(f"{where}.url_env: the environment variable {self.url_env} is not set")
        try:
            return _http_url(value)
        except ValueError as exc:
            raise ConfigError(f"{where}.url_env: {exc}") from None


SinkSpec = Annotated[AlertmanagerSinkSpec | WebhookSinkSpec | SlackSinkSpec, Field(discriminator="type")]


class ReceiverSpec(_Secret):
    """`POST /api/v1/alertmanager`: Alertmanager's webhook payloads become `external` findings."""

    enabled: bool = True
    # the first of these labels whose value names a watched instance maps the alert to it
    instance_labels: list[str] = Field(default_factory=lambda: ["medic_instance", "instance", "name"])
    # alerts carrying all of these label values are ignored (medic's own alerts, by default)
    ignore_labels: dict[str, str] = Field(default_factory=lambda: {"source": "medic"})
    max_body: Annotated[Size, size_within(1024, 64 * 2**20)] = 1024 * 1024
    max_alerts: int = Field(1000, ge=1, le=100_000)
    stale_after: Annotated[Duration, within(60, 30 * DAY)] = 12 * 3600.0  # unseen this long: resolved
    signature_tolerance: Annotated[Duration, within(1, HOUR)] = 300.0

    @model_validator(mode="after")
    def _labels(self) -> ReceiverSpec:
        bad = [name for name in [*self.instance_labels, *self.ignore_labels] if not _LABEL_NAME.match(name)]
        if bad:
            raise ValueError(f"not Prometheus label names: {', '.join(bad)}")
        if not self.instance_labels:
            raise ValueError("instance_labels: give at least one label name")
        return self


class NotifySection(Strict):
    sinks: list[SinkSpec] = Field(default_factory=list)
    min_severity: Severity = "warning"
    # the link in each notification: `{instance}`, `{fleet}` and `{agent}` are replaced; default: the
    # dashboard at agent.external_url, else no link
    dashboard_url: str | None = None
    # each alert's runbook_url, `{alertname}` replaced by the alert's name in lower case (the anchor of
    # its section in docs/runbooks.md); the same base as dashboards/prometheus/medic-rules.yml
    runbook_url: str = RUNBOOK_URL
    fleet_label: str = "fleet"  # the instance label that names its fleet
    retry: RetrySpec = Field(default_factory=RetrySpec)
    receiver: ReceiverSpec = Field(default_factory=ReceiverSpec)
    keep_delivered: Annotated[Duration, within(60, 365 * DAY)] = 7 * 86400.0
    keep_dead: Annotated[Duration, within(60, 365 * DAY)] = 30 * 86400.0

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"sinks": data} if isinstance(data, list) else data

    @model_validator(mode="after")
    def _unique_names(self) -> NotifySection:
        names = sink_names(self.sinks)
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(
                f"sinks: the name(s) {', '.join(duplicates)} are used twice; give each sink a name"
            )
        if self.dashboard_url is not None:
            try:
                _http_url(fill(self.dashboard_url, instance="x", fleet="x", agent="x"))
            except ValueError as exc:
                raise ValueError(f"dashboard_url: {exc}") from None
        try:
            _http_url(fill(self.runbook_url, alertname="x"))
        except ValueError as exc:
            raise ValueError(f"runbook_url: {exc}") from None
        return self


def fill(template: str, **values: str) -> str:
    """`template` with each `{key}` replaced by its value (no other brace is special)."""
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def sink_names(sinks: list[Any]) -> list[str]:
    """Each sink's name: its `name`, else its type, numbered when several sinks share a type."""
    counts: dict[str, int] = {}
    for sink in sinks:
        counts[sink.type] = counts.get(sink.type, 0) + 1
    seen: dict[str, int] = {}
    names = []
    for sink in sinks:
        if sink.name:
            names.append(sink.name)
            continue
        index = seen.get(sink.type, 0)
        seen[sink.type] = index + 1
        names.append(sink.type if counts[sink.type] == 1 else f"{sink.type}-{index}")
    return names


def replica_names(name: str, spec: AlertmanagerSinkSpec) -> list[str]:
    """`name` for a single Alertmanager; `name@host:port` for each replica of an HA one (each has
    its own outbox queue under that name)."""
    if spec.urls is None:
        return [name]
    hosts = [urlsplit(url).netloc for url in spec.urls]
    if len(set(hosts)) != len(hosts):
        return [f"{name}@{index}" for index in range(len(hosts))]
    return [f"{name}@{host}" for host in hosts]


def delivery_names(sinks: list[Any]) -> list[str]:
    """The outbox queue of every sink: its name, or one per replica of an HA Alertmanager."""
    out: list[str] = []
    for spec, name in zip(sinks, sink_names(sinks), strict=True):
        out.extend(replica_names(name, spec) if isinstance(spec, AlertmanagerSinkSpec) else [name])
    return out
