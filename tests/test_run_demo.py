"""`medic run` with no config (what `make run` starts): within two minutes a real leak finding with a
time to OOM, its suspect (the line of the workload that fills the cache) and a planned restart, and a
banner that says the windows are compressed."""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import pytest

from agent.demo import workload
from support.procs import PYTHON, REPO, wait_until


def leaking_line() -> str:
    """`path:line` of the workload's line that fills its response cache."""
    path = workload.__file__
    with open(path) as source:
        number = next(
            i
            for i, line in enumerate(source, 1)
            if line.rstrip().endswith("# leaks: a response cache that nothing reads back or evicts")
        )
    return f"{path}:{number}"


pytestmark = pytest.mark.slow


def test_the_built_in_demo_shows_a_leak_and_a_planned_restart_within_two_minutes(tmp_path):
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [PYTHON, "-m", "agent.cli.main", "run", "--port", "0", "--state-dir", str(state)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    started = time.monotonic()
    try:
        info = wait_until(
            lambda: (state / "agent.json").exists() and json.loads((state / "agent.json").read_text()), 30
        )
        url = info["url"]

        def leak() -> dict | None:
            findings = httpx.get(f"{url}/api/v1/findings", timeout=5).json()["findings"]
            found = [f for f in findings if f["instance"] == "demo-leaky" and f["kind"] == "leak"]
            return found[0] if found else None

        finding = wait_until(leak, 120, interval=1.0)
        assert finding["evidence"]["time_to_oom_seconds"] > 0

        def named() -> dict | None:  # the allocation sites, traced once the finding opened
            found = leak() or {}
            suspects = (found.get("evidence") or {}).get("suspects") or []
            return found if suspects and suspects[0]["name"] == leaking_line() else None

        named_at = wait_until(named, max(5.0, 120 - (time.monotonic() - started)), interval=1.0)
        assert named_at["evidence"]["suspects"][0]["kind"] == "site"
        assert not [
            f
            for f in httpx.get(f"{url}/api/v1/findings", timeout=5).json()["findings"]
            if f["instance"] == "demo-stable"
        ]

        def planned() -> dict | None:
            step = httpx.get(f"{url}/api/v1/plan", timeout=5).json()["step"] or {}
            entries = (step.get("plan") or {}).get("entries", [])
            return next((e for e in entries if e["instance"] == "demo-leaky" and not e["hopeless"]), None)

        entry = wait_until(planned, max(5.0, 120 - (time.monotonic() - started)), interval=1.0)
        assert entry["kind"] in ("leak", "oom-risk") and entry["slot_at"] <= entry["deadline"]
        assert time.monotonic() - started < 120, "the demo must show its finding and plan within two minutes"
        dashboard = httpx.get(f"{url}/", timeout=5)
        assert dashboard.status_code == 200
        assert httpx.get(f"{url}/api/v1/instances", timeout=5).json()["time_scale"] == 360
    finally:
        proc.terminate()
        _, banner = proc.communicate(timeout=30)
    assert "DEMO TIME: detection windows are compressed 360x" in banner
    assert "Dashboard: http://127.0.0.1:" in banner and "160Mi memory limit" in banner
