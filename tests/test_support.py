"""The test helpers themselves: a child that never gets ready fails in time and says why."""

from __future__ import annotations

import subprocess
import time

import pytest

from support.procs import PYTHON, wait_ready


def _child(spawn, code: str) -> subprocess.Popen:
    return spawn([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True)


def test_wait_ready_returns_the_words_and_leaves_the_rest_of_the_stream(spawn):
    proc = _child(spawn, "print('ready 42'); print('next', flush=True)")
    assert wait_ready(proc) == ["ready", "42"]
    assert proc.stdout.readline() == "next\n"


def test_a_silent_child_fails_after_the_timeout(spawn):
    proc = _child(spawn, "import time; time.sleep(60)")
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"no `ready` line within 0.5s: printed '', exit status None"):
        wait_ready(proc, timeout=0.5)
    assert time.monotonic() - started < 5


def test_a_child_that_dies_shows_its_output_and_exit_status(spawn):
    proc = _child(spawn, "import sys; print('boom', flush=True); sys.exit(3)")
    with pytest.raises(AssertionError, match=r"printed 'boom\\n', exit status 3"):
        wait_ready(proc)
