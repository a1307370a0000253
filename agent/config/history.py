"""The `history:` section: where the agent reads its workloads' past when it starts with none.

    history:
      prometheus:
        url: https://prometheus.example:9090
        query: process_resident_memory_bytes{job="ranker"}
        lookback: 8d
        step: 1m
        bearer_token_file: /etc/medic/prometheus.token   # or headers: {X-Scope-OrgID: team-a}
        tls: {ca_file: /etc/medic/prom-ca.pem, cert_file: ..., key_file: ...}

`credentials` reads the token and the TLS files as the admin token is read (`probes.linux.secrets`):
a problem there is a `ConfigError` or `UnsafePath` naming the key. `agent.jobs.history` turns the
section into a pull (`agent.series.prometheus_pull`). docs/detection.md lists every key.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from agent.core.types import DAY, HOUR, Duration, Size, Strict, size_within, within
from agent.notify.config import HttpUrl
from probes.linux.secrets import client_tls_context, read_token

WHERE = "history.prometheus"
MAX_POINTS_PER_SERIES = 11_000  # Prometheus refuses more points per series in one query_range
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")


class TlsFilesSection(Strict):
    ca_file: Path | None = None  # the CA bundle that signed the server's certificate; default: the system's
    cert_file: Path | None = None  # a client certificate (mutual TLS)
    key_file: Path | None = None  # its private key (PEM, unencrypted, 0600)

    @model_validator(mode="after")
    def _pair(self) -> TlsFilesSection:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(
                "cert_file and key_file go together: set both for a client certificate, or neither"
            )
        return self


class PrometheusHistorySection(Strict):
    url: HttpUrl  # the server's base URL (its /api/v1/query_range is read)
    query: str = Field(min_length=1, max_length=4096)  # PromQL giving one memory series per instance
    lookback: Annotated[Duration, within(HOUR, 90 * DAY)] = 8 * DAY
    step: Annotated[Duration, within(1, HOUR)] = 60.0
    refresh: Annotated[Duration, within(HOUR, 30 * DAY)] = DAY  # read again this often
    label: str | None = None  # the label naming the instance; default: instance, pod, name, job
    metric: str = "rss_bytes"  # the name of series the query returns without __name__
    bearer_token_file: Path | None = None  # sent as `Authorization: Bearer <token>`; 0600
    headers: dict[str, str] = Field(default_factory=dict, max_length=32)
    tls: TlsFilesSection | None = None
    timeout: Annotated[Duration, within(0, 600, above=True)] = 30.0  # one request
    deadline: Annotated[Duration, within(1, HOUR)] = 300.0  # the whole pull: over it, no history
    max_samples: int = Field(5_000_000, ge=1000, le=100_000_000)
    max_bytes: Annotated[Size, size_within(2**20, 16 * 2**30)] = 2**30
    chunk_points: int = Field(1440, ge=10, le=MAX_POINTS_PER_SERIES)  # steps per request

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"header name {name[:40]!r} is not an HTTP token")
            if any(ch in text for ch in "\r\n\0") or len(text) > 4096:
                raise ValueError(f"header {name}: the value must be one line of at most 4096 characters")
        return value

    @model_validator(mode="after")
    def _one_authorization(self) -> PrometheusHistorySection:
        named = {name.lower() for name in self.headers}
        if self.bearer_token_file is not None and "authorization" in named:
            raise ValueError("give bearer_token_file or an Authorization header, not both")
        if self.tls is not None and not self.url.startswith("https://"):
            raise ValueError(f"tls is set but url {self.url} is not https://")
        return self

    def credentials(self) -> tuple[dict[str, str], ssl.SSLContext | None]:
        """The request headers (with the bearer token) and the TLS context, their files read and checked."""
        headers = dict(self.headers)
        if self.bearer_token_file is not None:
            token = read_token(self.bearer_token_file, f"{WHERE}.bearer_token_file")
            headers["Authorization"] = f"Bearer {token}"
        context = None
        if self.tls is not None:
            context = client_tls_context(
                self.tls.ca_file, self.tls.cert_file, self.tls.key_file, f"{WHERE}.tls"
            )
        return headers, context


class HistorySection(Strict):
    prometheus: PrometheusHistorySection | None = None  # None: no history but the agent's own store
