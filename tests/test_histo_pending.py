"""`medic histo NAME --diff` before there is anything to compare: one line in the words of the
instance's own runtime (a Python process is told about the in-process hook, not the JVM), exit 0."""

from __future__ import annotations

import json

import pytest

from support.procs import PYTHON

pytestmark = pytest.mark.slow


def test_a_python_target_without_histograms_yet_gets_a_python_answer(agent, spawn):
    target = spawn([PYTHON, "-c", "import time; time.sleep(300)"])
    agent.start({"instances": [{"name": "py", "match": {"pid": target.pid}}]})
    done = agent.cli("histo", "py", "--diff", "1h")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("py: no type histogram diff yet: no type histograms of py yet: ")
    assert "JVM" not in done.stdout and done.stderr == ""
    as_json = json.loads(agent.cli("histo", "py", "--diff", "1h", "--json").stdout)
    assert as_json["kind"] == "type" and as_json["rows"] == [] and as_json["pending"]
    unknown = agent.cli("histo", "nope", "--diff", "1h")
    assert unknown.returncode == 4 and "no instance named 'nope'" in unknown.stderr
