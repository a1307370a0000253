"""How medic proves who it is to etcd and checks who etcd is: TLS, client certificates, user/password.

    remediation.coordinator.etcd:
      endpoints: [https://10.0.0.5:2379]
      tls: {ca_file: /etc/medic/etcd-ca.pem, cert_file: /etc/medic/etcd.pem, key_file: /etc/medic/etcd.key}
      auth: {username: medic, password_file: /etc/medic/etcd.password}

The sections are mounted in `remediation/config.py`; `load_etcd_security` reads the files when the
coordinator is built. The key and the password are secrets and are checked like `agent.token_file`
(a regular file, no symlink, owned by root or medic's user, no group/other permission); the CA bundle
and the certificate are public but must not be replaceable by another user. Every problem is a
`ConfigError` or `UnsafePath` naming the key and the fix; the password is never put in a message.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import field_validator, model_validator

from agent.core.errors import ConfigError
from agent.core.types import Strict
from probes.linux.secrets import MAX_SECRET_BYTES, client_tls_context, read_secret

WHERE = "remediation.coordinator.etcd"


class EtcdTlsSection(Strict):
    ca_file: Path | None = None  # the CA bundle that signed etcd's certificate; default: the system's
    cert_file: Path | None = None  # a client certificate, for etcd's --client-cert-auth
    key_file: Path | None = None  # its private key (PEM, unencrypted, 0600)

    @model_validator(mode="after")
    def _pair(self) -> EtcdTlsSection:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(
                "cert_file and key_file go together: set both for a client certificate, or neither"
            )
        return self


class EtcdAuthSection(Strict):
    username: str
    password_file: Path  # the password alone in a 0600 file: never written in the config

    @field_validator("username")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.match(r"^[^\s\x00-\x1f\x7f]{1,128}$", value):
            raise ValueError(
                "expected an etcd user name: 1 to 128 characters, no spaces or control characters"
            )
        return value


@dataclass(frozen=True)
class EtcdSecurity:
    """What the gateway needs, read and checked: the TLS context and the credentials."""

    ssl_context: ssl.SSLContext | None = None  # None: plain http, or https with the system's CAs
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    client_certificate: bool = False

    def describe(self) -> str:
        parts = []
        if self.ssl_context is not None:
            parts.append("mutual TLS" if self.client_certificate else "TLS")
        if self.username:
            parts.append(f"user {self.username}")
        return ", ".join(parts)


def load_etcd_security(tls: EtcdTlsSection | None, auth: EtcdAuthSection | None) -> EtcdSecurity:
    """Read and check the configured files; `ConfigError`/`UnsafePath` with the key and the fix."""
    context = None
    if tls is not None:
        context = client_tls_context(tls.ca_file, tls.cert_file, tls.key_file, f"{WHERE}.tls")
    username = password = None
    if auth is not None:
        username = auth.username
        password = read_secret(auth.password_file, f"{WHERE}.auth.password_file", MAX_SECRET_BYTES)
        password = password.strip("\r\n")
        if not password:
            raise ConfigError(f"{WHERE}.auth.password_file: {auth.password_file} is empty")
    return EtcdSecurity(context, username, password, client_certificate=bool(tls and tls.cert_file))
