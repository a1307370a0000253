"""One agent per state directory: the lock refuses a second holder, names the first, and dies with it.

Real processes hold the lock where the point is what the kernel does when the holder dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys

import pytest

from agent.core.errors import ConfigError, UnsafePath
from agent.state import AGENT_FILE_NAME
from agent.state.lock import LOCK_FILE_NAME, hold_state_dir
from probes.linux.fstrust import atomic_write, ensure_private_dir
from support.procs import REPO

HOLDER = """
import subprocess, sys, time
from agent.state.lock import hold_state_dir
lock = hold_state_dir(sys.argv[1])
# a child started while the lock is held (as a managed instance is), even one given every descriptor
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], close_fds=False)
print("held", child.pid, flush=True)
time.sleep(600)
"""


@pytest.fixture
def state_dir(tmp_path):
    return ensure_private_dir(tmp_path / "state", "state_dir")


def test_a_second_holder_is_refused_until_the_first_releases(state_dir):
    first = hold_state_dir(state_dir)
    with pytest.raises(ConfigError) as refused:
        hold_state_dir(state_dir)
    message = str(refused.value)
    assert f"agent.state_dir {state_dir} is in use by another medic (pid {os.getpid()})" in message
    assert "its own agent.state_dir" in message
    first.release()
    first.release()  # twice is harmless
    with hold_state_dir(state_dir):
        pass
    assert os.stat(state_dir / LOCK_FILE_NAME).st_mode & 0o777 == 0o600


def test_the_refusal_names_the_holders_api_when_its_agent_file_is_its_own(state_dir):
    with hold_state_dir(state_dir):
        atomic_write(
            state_dir / AGENT_FILE_NAME,
            json.dumps({"pid": os.getpid(), "url": "http://127.0.0.1:41"}).encode(),
        )
        with pytest.raises(ConfigError, match=r"\(pid \d+, API http://127\.0\.0\.1:41\)"):
            hold_state_dir(state_dir)
        # an agent.json left by another (dead) agent is not taken for the holder's
        atomic_write(
            state_dir / AGENT_FILE_NAME, json.dumps({"pid": 1, "url": "http://127.0.0.1:42"}).encode()
        )
        with pytest.raises(ConfigError) as refused:
            hold_state_dir(state_dir)
        assert f"(pid {os.getpid()})" in str(refused.value) and "127.0.0.1:42" not in str(refused.value)


@pytest.mark.parametrize("content", [b"", b"garbage\x00\xff", b'{"pid": true}', b"[1]", b'{"pid": "1"}'])
def test_a_lock_file_with_anything_in_it_still_locks_and_the_refusal_stays_clear(state_dir, content):
    (state_dir / LOCK_FILE_NAME).write_bytes(content)
    os.chmod(state_dir / LOCK_FILE_NAME, 0o600)
    other = os.open(state_dir / LOCK_FILE_NAME, os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)  # held through a descriptor that never wrote who it is
        with pytest.raises(ConfigError) as refused:
            hold_state_dir(state_dir)
        assert str(refused.value).startswith(f"agent.state_dir {state_dir} is in use by another medic")
    finally:
        os.close(other)
    with hold_state_dir(state_dir):
        record = json.loads((state_dir / LOCK_FILE_NAME).read_bytes())
        assert record["pid"] == os.getpid()  # the new holder wrote itself over the old content


def test_a_symlink_planted_at_the_lock_is_refused_and_its_target_untouched(state_dir, tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    (state_dir / LOCK_FILE_NAME).symlink_to(target)
    with pytest.raises(UnsafePath, match="symlink"):
        hold_state_dir(state_dir)
    assert target.read_text() == "keep me"


def test_a_killed_holder_frees_the_state_dir_and_its_children_never_keep_it(state_dir):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(state_dir)], stdout=subprocess.PIPE, env=env, text=True
    )
    child = None
    try:
        assert holder.stdout is not None
        word, child_pid = holder.stdout.readline().split()
        assert word == "held"
        child = int(child_pid)
        with pytest.raises(ConfigError, match=rf"\(pid {holder.pid}\)"):
            hold_state_dir(state_dir)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        os.kill(child, 0)  # the child outlives its holder ...
        with hold_state_dir(state_dir):  # ... and does not keep the lock
            pass
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdout.close()
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
