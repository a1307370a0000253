"""Bytes on the command line that are not UTF-8 (a terminal in Latin-1, a pasted binary): a pause is
made with its reason mended, and where text cannot be mended (an instance name) the CLI says so in
one line, never a traceback."""

from __future__ import annotations

import os
import subprocess

import pytest

from agent.cli.options import free_text
from support.procs import PYTHON, REPO

pytestmark = pytest.mark.slow


def medic_bytes(agent, *args: bytes) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MEDIC_STATE_DIR": str(agent.state_dir)}
    argv = [PYTHON.encode(), b"-m", b"agent.cli.main", *args, b"--url", agent.url.encode()]
    return subprocess.run(argv, capture_output=True, timeout=60, env=env)


def test_a_pause_with_a_reason_that_is_not_utf8_is_made(agent):
    agent.start({})
    paused = medic_bytes(agent, b"pause", b"--for", b"10m", b"--reason", b"disk \xff full \xe9t\xe9")
    assert paused.returncode == 0, paused.stderr.decode()
    assert b"Traceback" not in paused.stderr
    pause = agent.get("/api/v1/plan")["paused"]
    assert pause["reason"] == "disk \ufffd full \ufffdt\ufffd"
    assert "disk \ufffd full" in paused.stdout.decode()

    named = medic_bytes(agent, b"histo", b"serving-\xff")
    assert named.returncode == 2 and b"Traceback" not in named.stderr
    assert b"not UTF-8" in named.stderr and named.stderr.count(b"\n") == 1


def test_free_text_keeps_what_is_text():
    assert free_text("investigating INC-12 — by hand") == "investigating INC-12 — by hand"
    assert free_text("a\udcffb") == "a\ufffdb"
    assert free_text("\ud800") == "?"  # a surrogate no byte of argv made
