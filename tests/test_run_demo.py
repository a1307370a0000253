"""`medic run` with no config (what `make run` starts): within two minutes a slow finding on the slow
one of four real workloads, and a leak finding with a time to OOM and its suspect (the line of the
workload that fills the cache); in enforce mode, the leak restarted before it reaches its limit; a
banner that says time is compressed."""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import pytest

from agent.cli.run import DEMO_AGENT, DEMO_DETECT, DEMO_LIMIT, DEMO_REMEDIATION, demo_instances
from agent.config.loader import validate_config
from agent.config.timescale import time_axis
from agent.core.units import parse_size
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


def test_the_demo_config_judges_on_held_windows_and_restarts_on_the_compressed_axis():
    config = validate_config(
        {
            "agent": DEMO_AGENT,
            "detect": DEMO_DETECT,
            "remediation": DEMO_REMEDIATION,
            "instances": demo_instances(),
        }
    )
    axis = time_axis(config)
    assert (
        axis.slow.stale >= 3 * config.agent.interval and axis.slow.peer_window >= 10 * config.agent.interval
    )
    assert axis.remediation.mode == "enforce" and axis.remediation.plan.safety_margin == 10.0
    assert {spec.name for spec in config.instances} == {"demo-leaky", "demo-stable", "demo-fast", "demo-slow"}


def test_the_built_in_demo_finds_the_slow_one_and_the_leak_and_restarts_the_leak_before_its_limit(tmp_path):
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

        def opened() -> list[dict]:
            events = httpx.get(
                f"{url}/api/v1/events", params={"kind": "finding_opened", "limit": 1000}, timeout=5
            )
            return [e["data"]["finding"] for e in events.json()["events"]]

        def finding(instance: str, kind: str) -> dict | None:
            return next((f for f in opened() if f["instance"] == instance and f["kind"] == kind), None)

        def named() -> dict | None:
            """The line that fills the cache: the first suspect's allocation site (traced once the
            finding opened), or the line that adds to the container it names."""
            for found in httpx.get(f"{url}/api/v1/findings", timeout=5).json()["findings"]:
                suspects = (found.get("evidence") or {}).get("suspects") or []
                if found["instance"] == "demo-leaky" and suspects:
                    first = suspects[0]
                    if leaking_line() == (
                        first["name"] if first["kind"] == "site" else first.get("added_at")
                    ):
                        return found
            return None

        # the leak detector or the OOM projection, whichever speaks first: both say it runs out
        leak = wait_until(
            lambda: finding("demo-leaky", "leak") or finding("demo-leaky", "oom-risk"), 120, 1.0
        )
        assert leak["evidence"]["time_to_oom_seconds"] > 0
        slow = wait_until(
            lambda: finding("demo-slow", "slow"), max(5.0, 120 - (time.monotonic() - started)), 1.0
        )
        assert "peer" in slow["evidence"]["fired"], slow["summary"]
        wait_until(named, max(5.0, 120 - (time.monotonic() - started)), 1.0)

        def restarted() -> dict | None:
            events = httpx.get(
                f"{url}/api/v1/events", params={"kind": "remediation_restart_succeeded"}, timeout=5
            )
            return next((e for e in events.json()["events"] if e["instance"] == "demo-leaky"), None)

        wait_until(restarted, 180, interval=1.0)
        rss = httpx.get(
            f"{url}/api/v1/instances/demo-leaky/series",
            params={"metric": "rss_bytes", "since": "10m"},
            timeout=5,
        ).json()["points"]
        assert rss and max(value for _, value in rss) < parse_size(DEMO_LIMIT), "restarted before its limit"
        assert not [f["summary"] for f in opened() if f["instance"] in ("demo-stable", "demo-fast")]
        assert httpx.get(f"{url}/", timeout=5).status_code == 200
        assert httpx.get(f"{url}/api/v1/instances", timeout=5).json()["time_scale"] == 360
    finally:
        proc.terminate()
        _, banner = proc.communicate(timeout=30)
    assert "DEMO TIME: compressed 360x (agent.time_scale" in banner
    assert "Dashboard: http://127.0.0.1:" in banner and "160Mi memory limit" in banner
