"""Secrets and certificates medic reads from files: every one goes through here.

A secret (a private key, a password, a bearer or admin token, a signing key) must be a regular file
(no symlink) owned by root or medic's user, with no group/other permission, in directories nobody
else can write, and small; a certificate or CA bundle may be world-readable but nobody else may be
able to replace it. Every problem is a `ConfigError` or `UnsafePath` naming the config key (or the
option) and the fix, never the secret. `read_secret` gives the text as it is (a PEM key, a password);
`read_token` one line of printable ASCII (what goes into a header or an HMAC).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from agent.core.errors import ConfigError, UnsafePath
from probes.linux.fstrust import check_trusted_path, read_private_file

if TYPE_CHECKING:
    import ssl

MAX_PEM_BYTES = 1 << 20  # a CA bundle of a few hundred certificates
MAX_SECRET_BYTES = 4096  # a password or a token


def client_tls_context(
    ca_file: Path | None, cert_file: Path | None, key_file: Path | None, where: str
) -> ssl.SSLContext:
    """A TLS client context that trusts `ca_file` (else the system's CAs) and presents `cert_file`
    with `key_file` when both are set; `where` is the config key the messages name."""
    import ssl  # here: the token readers (the CLI's, the config's) need no TLS

    if ca_file is not None:
        check_public(ca_file, f"{where}.ca_file")
        try:
            context = ssl.create_default_context(cafile=str(ca_file))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"{where}.ca_file: {ca_file} holds no usable PEM certificate ({exc})") from None
    else:
        context = ssl.create_default_context()
    if cert_file is not None and key_file is not None:
        check_public(cert_file, f"{where}.cert_file")
        key = read_secret(key_file, f"{where}.key_file", MAX_PEM_BYTES)
        if "ENCRYPTED" in key:
            raise ConfigError(
                f"{where}.key_file: {key_file} is encrypted and medic cannot ask for its passphrase; "
                f"store it decrypted with `openssl pkey -in KEY -out {key_file}` (mode 0600)"
            )
        try:  # the password callback keeps OpenSSL from prompting on a terminal
            context.load_cert_chain(str(cert_file), str(key_file), password=lambda: b"")
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"{where}: cannot use cert_file {cert_file} with key_file {key_file} ({exc}); "
                "expected a PEM certificate and the PEM private key that belongs to it"
            ) from None
    return context


def check_public(path: Path, where: str) -> None:
    """A certificate medic trusts: it must exist and nobody else may be able to replace it."""
    if not path.is_file():
        raise ConfigError(f"{where}: {path} does not exist or is not a regular file")
    try:
        check_trusted_path(path)
    except UnsafePath as exc:
        raise UnsafePath(f"{where} {path}: {exc}") from None
    if path.stat().st_size > MAX_PEM_BYTES:
        raise ConfigError(f"{where}: {path} is over {MAX_PEM_BYTES} bytes: not a certificate bundle")


def read_secret(path: Path, where: str, max_bytes: int, owners: Collection[int] | None = None) -> str:
    """A private key or password as text: a regular file, not a symlink, owned by one of `owners`
    (default: root and medic's user), no group/other permission, at most `max_bytes`, in a directory
    nobody else can change."""
    if not path.exists():
        raise ConfigError(f"{where}: {path} does not exist")
    try:
        check_trusted_path(path.parent)
    except UnsafePath as exc:
        raise UnsafePath(f"{where} {path}: {exc}") from None
    try:
        data = read_private_file(path, where, owners, max_bytes=max_bytes)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:  # its message would quote a byte of the secret
        raise ConfigError(f"{where}: {path} is not UTF-8 text") from None


def read_token(path: Path, where: str, min_chars: int = 1, owners: Collection[int] | None = None) -> str:
    """A token or signing key: `read_secret`, then one line of printable ASCII (surrounding
    whitespace dropped) of at least `min_chars` characters."""
    token = read_secret(path, where, MAX_SECRET_BYTES, owners).strip()
    if not token or not (token.isascii() and token.isprintable()):  # it goes into a header or an HMAC
        raise ConfigError(f"{where}: {path} holds no token on one line (printable ASCII)")
    if len(token) < min_chars:
        raise ConfigError(f"{where}: {path} holds fewer than {min_chars} characters; use a longer secret")
    return token
