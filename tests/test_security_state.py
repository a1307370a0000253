"""medic's own files cannot be planted, redirected or lost, and the kill switch works on a full disk.

Another user who can write the state directory could plant `admin.token` (and then pause remediation
with a token they know) or a symlink where medic writes (and have root overwrite its target). So the
state, evidence and coordinator directories are refused when another user can change them, files are
created under fresh `O_EXCL | O_NOFOLLOW` names, and secrets are read without following symlinks.
A full disk must not disarm the kill switch: `medic pause` holds in memory at once, says that it is
not stored yet, and is stored when space comes back. Real agents, real tmpfs mounts (root only).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.api.auth import load_or_create_token
from agent.config.loader import validate_config
from agent.core.errors import ConfigError, StoreError, UnsafePath
from agent.core.records import Sample
from agent.state.eventlog import EventLog
from agent.state.store import Store
from probes.linux.fstrust import atomic_write
from probes.linux.secrets import read_token
from remediation.config import RemediationSection
from remediation.coordinator.local import LocalCoordinator
from remediation.engine import Engine
from remediation.evidence import EvidenceStore
from remediation.model import InstanceView, RemediationRequest
from support.procs import VERIFY_TIMEOUT, wait_until, workload_argv

NOBODY = 65534
IS_ROOT = os.geteuid() == 0
TOKEN = "0123456789abcdef0123456789abcdef"
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (chown to another user, mount a tmpfs)")


def _secret(path: Path, text: str = TOKEN, mode: int = 0o600) -> Path:
    path.write_text(text + "\n")
    os.chmod(path, mode)
    return path


# ----------------------------------------------------------------------------- full filesystems
@pytest.fixture
def small_fs() -> Iterator[Callable[[Path, str], Path]]:
    """`small_fs(path, size)`: a tmpfs of `size` mounted on `path` (0700), unmounted at teardown."""
    mounts: list[Path] = []

    def mount(path: Path, size: str = "4m") -> Path:
        if not IS_ROOT:
            pytest.skip("mounting a tmpfs needs root")
        path.mkdir(mode=0o700, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "medic-test", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounts.append(path)
        return path

    yield mount
    for path in reversed(mounts):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(directory: Path) -> Path:
    """Fill the filesystem of `directory` to the last block."""
    ballast = directory / "ballast"
    subprocess.run(["dd", "if=/dev/zero", f"of={ballast}", "bs=64k"], capture_output=True)
    assert os.statvfs(directory).f_bavail == 0
    return ballast


# ----------------------------------------------------------------------------- the state directory at start
def start_and_fail(agent, state_dir: Path) -> str:
    agent.state_dir = state_dir
    proc = agent.start({"instances": []}, wait=False)
    assert proc.wait(timeout=30) == 2, agent.log.read_text()
    output = agent.log.read_text()
    assert "Traceback" not in output, output
    return output


def test_a_world_writable_state_dir_is_refused_at_start(agent, tmp_path):
    state = tmp_path / "shared"
    state.mkdir()
    os.chmod(state, 0o777)
    output = start_and_fail(agent, state)
    assert f"medic: error: agent.state_dir {state} is writable by other users" in output
    assert f"chmod 700 {state}" in output
    assert list(state.iterdir()) == []  # nothing written into it


def test_a_symlinked_state_dir_is_refused_at_start(agent, tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(real)
    output = start_and_fail(agent, tmp_path / "state")
    assert "is a symlink" in output and str(real) in output
    assert list(real.iterdir()) == []


def test_a_0755_state_dir_of_ours_is_tightened(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    Store(state).close()
    assert os.stat(state).st_mode & 0o777 == 0o700
    assert os.stat(state / "medic.db").st_mode & 0o777 == 0o600


@needs_root
def test_a_state_dir_another_user_owns_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=rf"belongs to uid {NOBODY}.*chown"):
        Store(state)
    assert list(state.iterdir()) == []


def test_a_symlink_planted_at_the_database_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victim = _secret(tmp_path / "victim", "precious")
    (state / "medic.db").symlink_to(victim)
    with pytest.raises(UnsafePath, match="symlink"):
        Store(state)
    assert victim.read_text() == "precious\n"


# ----------------------------------------------------------------------------- files medic writes
def test_atomic_write_replaces_a_planted_symlink_and_never_writes_its_target(tmp_path):
    victim = _secret(tmp_path / "victim", "precious")
    link = tmp_path / "agent.json"
    link.symlink_to(victim)
    atomic_write(link, b"{}")
    assert victim.read_text() == "precious\n"
    assert not link.is_symlink() and link.read_bytes() == b"{}"
    assert os.stat(link).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.json", "victim"]  # no temp left


def test_the_pidfile_does_not_follow_links_at_its_old_temp_or_final_name(tmp_path):
    from agent.runtime import Agent

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victims = [_secret(tmp_path / f"victim{i}", "precious") for i in range(2)]
    (state / "agent.tmp").symlink_to(victims[0])
    (state / "agent.json").symlink_to(victims[1])
    agent = Agent(validate_config({"agent": {"state_dir": str(state)}}))
    agent.address = ("127.0.0.1", 9464)
    agent._write_pidfile()
    assert [v.read_text() for v in victims] == ["precious\n", "precious\n"]
    info = json.loads((state / "agent.json").read_text())
    assert info["url"] == "http://127.0.0.1:9464" and not (state / "agent.json").is_symlink()


def test_evidence_does_not_follow_a_planted_symlink(tmp_path):
    victim = _secret(tmp_path / "victim", "precious")
    store = EvidenceStore(tmp_path / "evidence", timeout=5)
    folder = tmp_path / "evidence" / "svc" / "00000001"
    folder.mkdir(mode=0o700, parents=True)
    for name in ("finding.json", "smaps_rollup.txt"):
        (folder / name).symlink_to(victim)
    items = store.capture(
        1, InstanceView("svc", 1, 1.0), {"smaps_rollup": lambda v, t: "Rss: 1 kB"}, {"a": 1}
    )
    assert victim.read_text() == "precious\n"
    assert sorted(Path(i.path).name for i in items if i.path) == ["finding.json", "smaps_rollup.txt"]
    for item in items:
        assert not Path(item.path).is_symlink() and os.stat(item.path).st_mode & 0o777 == 0o600
    assert json.loads((folder / "finding.json").read_text()) == {"a": 1}


def test_evidence_does_not_copy_a_file_through_a_symlink(tmp_path):
    secret = _secret(tmp_path / "shadow", "root:secret")
    dump = tmp_path / "profile.heap"
    dump.symlink_to(secret)
    store = EvidenceStore(tmp_path / "evidence", timeout=5)
    [item] = store.capture(2, InstanceView("svc", 1, 1.0), {"heap_profile": lambda v, t: dump})
    assert item.path is None and "cannot store" in (item.error or "")


def test_a_world_writable_evidence_dir_is_refused(tmp_path):
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    os.chmod(evidence, 0o777)
    with pytest.raises(UnsafePath, match=r"evidence dir .* is writable by other users.*chmod 700"):
        EvidenceStore(evidence)


def test_the_local_coordinator_refuses_a_planted_symlink_or_an_open_directory(tmp_path):
    victim = _secret(tmp_path / "victim", "precious")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "coordinator.db").symlink_to(victim)
    with pytest.raises(UnsafePath, match="symlink"):
        LocalCoordinator(private / "coordinator.db")
    assert victim.read_text() == "precious\n"
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(UnsafePath, match=r"writable by group or others.*chmod go-w"):
        LocalCoordinator(shared / "coordinator.db")
    assert list(shared.iterdir()) == []


# ----------------------------------------------------------------------------- the admin token
def test_the_token_is_created_private(tmp_path):
    token, path = load_or_create_token(None, tmp_path / "state")
    assert len(token) == 64 and path == tmp_path / "state" / "admin.token"
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert load_or_create_token(None, tmp_path / "state")[0] == token  # read back, not replaced


def test_a_token_others_can_read_is_refused(tmp_path):
    configured = _secret(tmp_path / "token", mode=0o644)
    with pytest.raises(UnsafePath, match=rf"agent.token_file {configured} .*mode 0644.*chmod 600"):
        load_or_create_token(configured, tmp_path / "state")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    _secret(state / "admin.token", mode=0o640)
    with pytest.raises(UnsafePath, match="chmod 600"):
        load_or_create_token(None, state)


def test_a_token_that_is_a_symlink_is_refused(tmp_path):
    real = _secret(tmp_path / "real-token")
    (tmp_path / "token").symlink_to(real)
    with pytest.raises(UnsafePath, match="symlink"):
        load_or_create_token(tmp_path / "token", tmp_path / "state")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "admin.token").symlink_to(real)  # a token the planter knows
    with pytest.raises(UnsafePath, match="symlink"):
        load_or_create_token(None, state)


def test_a_token_in_a_directory_others_can_change_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone could swap the file for one whose token they know
    configured = _secret(shared / "token")
    with pytest.raises(UnsafePath, match=rf"agent.token_file {configured}: .*writable by group or others"):
        load_or_create_token(configured, tmp_path / "state")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=120))
def test_read_token_gives_one_printable_line_or_a_clear_error(tmp_path, content):
    """Whatever a token file holds: one stripped line of printable ASCII, or a ConfigError naming the
    setting, never another exception."""
    path = tmp_path / "token"
    path.unlink(missing_ok=True)
    path.write_bytes(content)
    os.chmod(path, 0o600)
    try:
        token = read_token(path, "x.token_file", min_chars=4)
    except ConfigError as exc:  # one of three sentences: nothing of the file's content is quoted
        reasons = r"(holds no token on one line \(printable ASCII\)|holds fewer than 4 characters; use a longer secret|is not UTF-8 text)"
        assert re.fullmatch(rf"x\.token_file: {re.escape(str(path))} {reasons}", str(exc)), str(exc)
        return
    assert token == content.decode().strip() and len(token) >= 4
    assert token.isascii() and token.isprintable()


@needs_root
def test_a_token_another_user_owns_is_refused(tmp_path):
    configured = _secret(tmp_path / "token")
    os.chown(configured, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=rf"belongs to uid {NOBODY}.*chown"):
        load_or_create_token(configured, tmp_path / "state")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(_secret(state / "admin.token"), NOBODY, NOBODY)  # planted: a token its owner knows
    with pytest.raises(UnsafePath, match=rf"admin token .* belongs to uid {NOBODY}"):
        load_or_create_token(None, state)


# ----------------------------------------------------------------------------- a full disk
def test_samples_on_a_full_disk_are_kept_and_written_when_space_returns(small_fs, tmp_path):
    state = small_fs(tmp_path / "state", "2m")
    store = Store(state)
    store.add_samples([Sample("svc", "rss_bytes", 1.0, 1.0)])
    store.flush()
    ballast = fill(state)
    store.add_samples([Sample("svc", "rss_bytes", float(i), float(2 + i)) for i in range(5000)])
    with pytest.raises(StoreError, match="kept in memory and retried"):
        store.flush()
    assert store.pending() == 5000 and store.write_error
    store.remember_instance("svc", 42, 1.0, 2.0)  # best effort: logged, not raised
    ballast.unlink()
    assert store.flush() == 5000 and store.write_error is None
    assert store.query("SELECT count(*) FROM samples") == [(5000,)]
    store.close()


def test_the_engine_pauses_in_memory_on_a_full_disk_and_stores_it_later(small_fs, tmp_path):
    state = small_fs(tmp_path / "state", "2m")
    store = Store(state)
    engine = Engine.from_config(
        RemediationSection.model_validate({"mode": "enforce"}),
        store=store,
        events=EventLog(store),
        agent_id="test",
        state_dir=state,
        background=False,
    )
    try:
        ballast = fill(state)
        engine.pause("disk drill", time.time() + 600, by="ops")
        storage = engine.pause_storage()
        assert storage["persisted"] is False and "holds in memory" in storage["warning"]
        assert engine.paused(time.time())["reason"] == "disk drill"
        held = engine.submit(RemediationRequest("svc", "manual", "m-1", "please"))
        assert held.code == "held" and "disk drill" in held.reason
        engine.step(time.time())  # still full: retried, nothing raised
        assert engine.pause_storage()["persisted"] is False and engine.ledger.pause() is None
        ballast.unlink()
        engine.step(time.time())
        assert engine.pause_storage() == {"persisted": True}
        assert engine.ledger.pause()["reason"] == "disk drill"
        ballast = fill(state)
        assert engine.resume(by="ops") is not None and engine.paused(time.time()) is None
        assert "brings the old pause back" in engine.pause_storage()["warning"]
        ballast.unlink()
        engine.step(time.time())
        assert engine.pause_storage() == {"persisted": True} and engine.ledger.pause() is None
    finally:
        engine.close()
        store.close()


FULL_DISK_CONFIG = {
    "agent": {"interval": "0.2s", "slow_interval": "2s", "flush_interval": "0.3s"},
    "remediation": {
        "mode": "enforce",
        "interval": "0.3s",
        "budget": {"max_concurrent": 1, "min_interval": "1s", "max_per_hour": None, "cooldown": "5s"},
        "blockers": {"min_uptime": "1s"},
        "verify": {"timeout": VERIFY_TIMEOUT, "stable_for": "1s"},
    },
    "instances": [
        {
            "name": "svc",
            "labels": {"fleet": "f"},
            "match": {"command": workload_argv("stable", "--size", "8Mi")},
        }
    ],
}


@pytest.mark.slow
@pytest.mark.root
def test_medic_pause_on_a_full_disk_stops_restarts(small_fs, agent):
    small_fs(agent.state_dir, "16m")
    agent.start(FULL_DISK_CONFIG)
    pid = wait_until(lambda: agent.instance("svc")["pid"], 30)
    # its `ready` line written before the disk fills: its output goes to the same filesystem, and a
    # workload whose print fails there exits and is launched again (a new pid, no restart of medic's)
    output = agent.state_dir / "logs" / "svc.log"
    wait_until(lambda: output.exists() and f"ready {pid}" in output.read_text(), 30)
    ballast = fill(agent.state_dir)
    wait_until(lambda: "cannot write samples" in agent.log.read_text(), 20)  # the store is failing now

    paused = agent.cli("pause", "--for", "10m", "--reason", "disk full drill")
    assert paused.returncode == 0, paused.stderr
    assert "not persisted" in paused.stderr and "holds in memory" in paused.stderr
    plan = agent.get("/api/v1/plan")
    assert plan["paused"]["reason"] == "disk full drill" and plan["pause_persisted"] is False
    restart = agent.cli("restart", "svc", "--reason", "drill: restart it")
    assert restart.returncode == 0 and "held" in restart.stdout, restart.stdout + restart.stderr
    time.sleep(1.5)
    assert agent.instance("svc")["pid"] == pid and agent.proc.poll() is None

    ballast.unlink()
    wait_until(lambda: agent.get("/api/v1/plan")["pause_persisted"], 20)
    db = sqlite3.connect(f"file:{agent.state_dir / 'medic.db'}?mode=ro", uri=True)
    try:
        [(value,)] = db.execute("SELECT value FROM remediation_control WHERE key = 'pause'").fetchall()
    finally:
        db.close()
    assert json.loads(value)["reason"] == "disk full drill"
    assert any(e["kind"] == "remediation_pause_stored" for e in agent.events())
    wait_until(
        lambda: any(
            d["instance"] == "svc" and d["code"] == "paused"
            for d in agent.get("/api/v1/decisions")["decisions"]
        ),
        20,
    )
    time.sleep(1.0)
    assert agent.instance("svc")["pid"] == pid
    assert not any(e["kind"] == "instance_restarted" for e in agent.events(instance="svc"))

    resumed = agent.cli("resume")
    assert resumed.returncode == 0 and "not persisted" not in resumed.stderr
    wait_until(lambda: agent.instance("svc")["pid"] not in (None, pid), 30)  # the held request runs now
