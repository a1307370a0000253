"""The etcd coordinator over TLS, mutual TLS and etcd's user/password auth, against a real etcd.

The certificates are made by the openssl CLI for each module; etcd runs with `--client-cert-auth`
and then with auth enabled (user root). A wrong CA, a missing client certificate, a wrong password
or a Common Name the gateway refuses each give an error that says what to fix, and the engine makes
no restart. Files holding secrets are refused like `agent.token_file` when others could read or
change them, and the password appears in no message.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent.core.errors import ConfigError, UnsafePath
from agent.state.eventlog import EventLog
from agent.state.store import Store
from agent.watch.discovery import by_pid
from remediation.config import RemediationSection
from remediation.coordinator import create_coordinator
from remediation.coordinator.base import SlotRequest
from remediation.coordinator.etcd_gateway import EtcdGateway
from remediation.coordinator.etcd_security import EtcdAuthSection, EtcdTlsSection, load_etcd_security
from remediation.engine import Engine, EngineHooks
from remediation.errors import CoordinatorError, CoordinatorUnavailable
from remediation.model import Decision, InstanceView, RemediationRequest
from support.remediation import NEEDS_ETCD, enable_etcd_auth, etcd_tls_server, make_etcd_certs

ROOT_PASSWORD = "s3cret-root-password-0123"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("etcd-certs")
    directory.chmod(0o700)
    return make_etcd_certs(directory)


@pytest.fixture(scope="module")
def mtls_url(certs):
    with etcd_tls_server(certs) as url:
        yield url


@pytest.fixture(scope="module")
def auth_url(certs):
    """etcd with mutual TLS and auth on; simple tokens live 2 s so a test can see one expire."""
    with etcd_tls_server(certs, auth_token_ttl=2) as url:
        enable_etcd_auth(url, certs, ROOT_PASSWORD)
        yield url


def private(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def section(url: str, tls: dict | None = None, auth: dict | None = None) -> RemediationSection:
    etcd: dict = {"endpoints": [url], "prefix": "/medic"}
    if tls is not None:
        etcd["tls"] = tls
    if auth is not None:
        etcd["auth"] = auth
    return RemediationSection.model_validate(
        {
            "mode": "enforce",
            "blockers": {"min_uptime": 0},
            "budget": {"max_concurrent": 1, "min_interval": 0, "max_per_hour": None, "cooldown": 0},
            "coordinator": {
                "backend": "etcd",
                "namespace": f"t{uuid.uuid4().hex[:8]}",
                "timeout": "2s",
                "etcd": etcd,
            },
        }
    )


def coordinator_for(config: RemediationSection, tmp_path: Path):
    return create_coordinator(config.coordinator, state_dir=tmp_path, retention=3600)


def gateway_for(config: RemediationSection) -> EtcdGateway:
    """The transport alone, built from the same section as the coordinator."""
    etcd = config.coordinator.etcd
    return EtcdGateway(etcd.endpoints, config.coordinator.timeout, load_etcd_security(etcd.tls, etcd.auth))


def round_trip(gateway: EtcdGateway) -> None:
    """A lease, a put on it and a read back: what the coordinator does on each step."""
    key = f"/medic/test/{uuid.uuid4().hex[:8]}"
    lease, _ = gateway.grant(5)
    gateway.call("kv/put", gateway.put_op(key, "v", lease)["request_put"])
    assert gateway.get(key)["value"] == "v"
    gateway.revoke(lease)
    assert gateway.get(key) is None


def mtls(certs, ca: str = "ca") -> dict:
    return {
        "ca_file": str(certs[ca]),
        "cert_file": str(certs["client"]),
        "key_file": str(certs["client_key"]),
    }


def allow(records, now):
    return Decision.allow("budget", "test: always")


def in_flight(coordinator) -> list[str]:
    return [record.instance for record in coordinator.restarts(0) if record.in_flight]


def slot(instance: str = "svc-1") -> SlotRequest:
    return SlotRequest(instance=instance, fleet="f", holder="agent-a", ttl=5)


def assert_no_restart(config: RemediationSection, tmp_path: Path, reason: str) -> str:
    """Run the engine on a real child with a manual restart request: blocked at the lock, child untouched."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    restarts: list[str] = []
    store = Store(tmp_path / "state")
    try:
        engine = Engine.from_config(
            config,
            store=store,
            events=EventLog(store),
            agent_id="agent-a",
            state_dir=store.dir,
            hooks=EngineHooks(
                locate=lambda name: by_pid(child.pid),
                managed_restart=lambda name, t: restarts.append(name) or 0,
            ),
        )
        try:
            engine.submit(RemediationRequest("svc", "manual", "M1", "on-call asked"))
            view = InstanceView("svc", child.pid, time.time() - 3600, labels={"fleet": "f"}, managed=True)
            for _ in range(3):
                report = engine.step(time.time(), [], [view])
                time.sleep(0.05)
            decision = report.decisions["svc"]
            assert decision.stage == "lock" and not decision.ok, decision
            assert reason in decision.reason, decision.reason
            assert restarts == [] and child.poll() is None
            # the manual request is answered in the ledger as held, with the reason, and never started
            actions = engine.ledger.actions()
            assert [a["outcome"] for a in actions] == ["held"], actions
            assert actions[0]["started_at"] is None and reason in actions[0]["detail"], actions
            return decision.reason
        finally:
            engine.close(timeout=5)
    finally:
        store.close()
        child.kill()
        child.wait()


# ----------------------------------------------------------------------------- config and files
def test_cert_and_key_go_together():
    with pytest.raises(ValidationError, match="cert_file and key_file go together"):
        section("https://127.0.0.1:2379", tls={"cert_file": "/etc/medic/c.pem"})
    with pytest.raises(ValidationError, match=r"auth\.username"):
        RemediationSection.model_validate(
            {"coordinator": {"backend": "etcd", "etcd": {"auth": {"password_file": "/x"}}}}
        )


def test_missing_files_are_config_errors(certs, tmp_path):
    with pytest.raises(ConfigError, match=r"tls\.ca_file: .*does not exist"):
        load_etcd_security(EtcdTlsSection(ca_file=tmp_path / "nope.pem"), None)
    with pytest.raises(ConfigError, match=r"tls\.key_file: .*does not exist"):
        load_etcd_security(EtcdTlsSection(cert_file=certs["client"], key_file=tmp_path / "nope.key"), None)
    with pytest.raises(ConfigError, match=r"auth\.password_file: .*does not exist"):
        load_etcd_security(None, EtcdAuthSection(username="root", password_file=tmp_path / "nope"))


def test_secret_files_others_can_read_or_write_are_refused(certs, tmp_path):
    key = private(tmp_path / "client.key", certs["client_key"].read_text(), 0o640)
    with pytest.raises(UnsafePath, match=r"tls\.key_file .*chmod 600"):
        load_etcd_security(EtcdTlsSection(cert_file=certs["client"], key_file=key), None)
    password = private(tmp_path / "pw", ROOT_PASSWORD, 0o604)
    with pytest.raises(UnsafePath, match=r"auth\.password_file .*chmod 600"):
        load_etcd_security(None, EtcdAuthSection(username="root", password_file=password))
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # past the umask
    in_shared = private(shared / "pw", ROOT_PASSWORD)
    with pytest.raises(UnsafePath, match="writable by group or others"):
        load_etcd_security(None, EtcdAuthSection(username="root", password_file=in_shared))
    ca = private(tmp_path / "ca.pem", certs["ca"].read_text(), 0o646)
    with pytest.raises(UnsafePath, match=r"tls\.ca_file .*writable by group or others"):
        load_etcd_security(EtcdTlsSection(ca_file=ca), None)
    os.symlink(certs["client_key"], tmp_path / "link.key")
    with pytest.raises(UnsafePath, match="symlink"):
        load_etcd_security(EtcdTlsSection(cert_file=certs["client"], key_file=tmp_path / "link.key"), None)


def test_unusable_keys_and_certificates_say_so(certs, tmp_path):
    garbage = private(tmp_path / "garbage.pem", "not a certificate\n", 0o644)
    with pytest.raises(ConfigError, match="no usable PEM certificate"):
        load_etcd_security(EtcdTlsSection(ca_file=garbage), None)
    wrong_key = EtcdTlsSection(cert_file=certs["client"], key_file=certs["client_cn_key"])
    with pytest.raises(ConfigError, match="the PEM private key that belongs to it"):
        load_etcd_security(wrong_key, None)
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(
        [
            "openssl",
            "pkey",
            "-in",
            str(certs["client_key"]),
            "-aes256",
            "-passout",
            "pass:x",
            "-out",
            str(encrypted),
        ],
        check=True,
        capture_output=True,
    )
    encrypted.chmod(0o600)
    with pytest.raises(ConfigError, match="is encrypted"):
        load_etcd_security(EtcdTlsSection(cert_file=certs["client"], key_file=encrypted), None)
    empty = private(tmp_path / "empty", "\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_etcd_security(None, EtcdAuthSection(username="root", password_file=empty))


def test_tls_needs_https_endpoints(certs):
    config = section("http://127.0.0.1:2379", tls={"ca_file": str(certs["ca"])})
    with pytest.raises(CoordinatorError, match="not https://"):
        gateway_for(config)


def test_the_password_is_never_shown(tmp_path):
    password = private(tmp_path / "pw", ROOT_PASSWORD)
    security = load_etcd_security(None, EtcdAuthSection(username="root", password_file=password))
    assert security.password == ROOT_PASSWORD
    assert ROOT_PASSWORD not in repr(security) and ROOT_PASSWORD not in security.describe()


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_usernames_are_accepted_or_refused_with_a_message(name):
    try:
        EtcdAuthSection(username=name, password_file=Path("/x"))
    except ValidationError as exc:
        assert "expected an etcd user name" in str(exc) or "string" in str(exc)


# ----------------------------------------------------------------------------- real etcd: mutual TLS
@NEEDS_ETCD
@pytest.mark.slow
def test_mutual_tls_round_trip(certs, mtls_url):
    gateway = gateway_for(section(mtls_url, tls=mtls(certs)))
    try:
        assert "mutual TLS" in gateway.describe()
        round_trip(gateway)
    finally:
        gateway.close()


@NEEDS_ETCD
@pytest.mark.slow
def test_mutual_tls_coordinates(certs, mtls_url, tmp_path):
    coordinator = coordinator_for(section(mtls_url, tls=mtls(certs)), tmp_path)
    try:
        assert "mutual TLS" in coordinator.describe()
        result = coordinator.acquire(slot(), allow)
        assert result.grant is not None
        assert in_flight(coordinator) == ["svc-1"]
        coordinator.release(result.grant, "succeeded")
        assert in_flight(coordinator) == []
    finally:
        coordinator.close()


@NEEDS_ETCD
@pytest.mark.slow
def test_wrong_ca_is_a_clear_error_and_no_restart(certs, mtls_url, tmp_path):
    config = section(mtls_url, tls=mtls(certs, ca="other_ca"))
    gateway = gateway_for(config)
    try:
        with pytest.raises(CoordinatorUnavailable, match=r"not signed by a CA in .*tls\.ca_file"):
            round_trip(gateway)
    finally:
        gateway.close()
    assert_no_restart(config, tmp_path, "tls.ca_file")


@NEEDS_ETCD
@pytest.mark.slow
def test_missing_client_certificate_is_a_clear_error_and_no_restart(certs, mtls_url, tmp_path):
    config = section(mtls_url, tls={"ca_file": str(certs["ca"])})
    gateway = gateway_for(config)
    try:
        with pytest.raises(CoordinatorUnavailable, match="requires a client certificate"):
            round_trip(gateway)
    finally:
        gateway.close()
    assert_no_restart(config, tmp_path, "tls.cert_file and tls.key_file")


# ----------------------------------------------------------------------------- real etcd: auth on
def root_auth(tmp_path: Path, password: str = ROOT_PASSWORD) -> dict:
    return {"username": "root", "password_file": str(private(tmp_path / "root.password", password + "\n"))}


@NEEDS_ETCD
@pytest.mark.slow
def test_password_auth_works_and_refreshes_an_expired_token(certs, auth_url, tmp_path):
    gateway = gateway_for(section(auth_url, tls=mtls(certs), auth=root_auth(tmp_path)))
    try:
        round_trip(gateway)
        first = gateway._token
        assert first and gateway._client.headers["Authorization"] == first
        time.sleep(3.5)  # past --auth-token-ttl 2: etcd forgets the token
        round_trip(gateway)
        assert gateway._token and gateway._token != first
    finally:
        gateway.close()


@NEEDS_ETCD
@pytest.mark.slow
def test_wrong_password_is_a_clear_error_and_no_restart(certs, auth_url, tmp_path):
    wrong = "not-the-root-password-987"
    config = section(auth_url, tls=mtls(certs), auth=root_auth(tmp_path, wrong))
    gateway = gateway_for(config)
    try:
        with pytest.raises(CoordinatorError, match="authentication as user root failed") as raised:
            round_trip(gateway)
        assert wrong not in str(raised.value) and "password_file" in str(raised.value)
        assert not isinstance(raised.value, CoordinatorUnavailable)
    finally:
        gateway.close()
    reason = assert_no_restart(config, tmp_path, "authentication as user root failed")
    assert wrong not in reason


@NEEDS_ETCD
@pytest.mark.slow
def test_no_credentials_on_an_auth_etcd_says_to_configure_them(certs, auth_url):
    gateway = gateway_for(section(auth_url, tls=mtls(certs)))
    try:
        with pytest.raises(CoordinatorError, match=r"set remediation\.coordinator\.etcd\.auth"):
            round_trip(gateway)
    finally:
        gateway.close()


@NEEDS_ETCD
@pytest.mark.slow
def test_a_client_certificate_with_a_common_name_is_explained(certs, auth_url, tmp_path):
    tls = {
        "ca_file": str(certs["ca"]),
        "cert_file": str(certs["client_cn"]),
        "key_file": str(certs["client_cn_key"]),
    }
    gateway = gateway_for(section(auth_url, tls=tls, auth=root_auth(tmp_path)))
    try:
        with pytest.raises(CoordinatorError, match="empty subject"):
            round_trip(gateway)
    finally:
        gateway.close()
