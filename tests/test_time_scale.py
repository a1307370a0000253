"""Compressed time with one knob, `detect.time_scale`: every detection duration divided by it; a config
whose detectors would need more raw history than the store keeps is refused with the fix; the lab
example passes `medic config check` and a real agent running it finds a real leak."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config.loader import load_config, parse_config
from agent.core.errors import ConfigError
from agent.detect.latency_rules import SlowParams
from agent.detect.params import DetectParams
from support.procs import PYTHON, REPO, wait_until, workload_argv

LAB = REPO / "examples" / "lab.yaml"


def test_time_scale_divides_every_detection_duration_given_or_default():
    detect = parse_config("detect: {time_scale: 180, memory: {window: 12h}, slow: {trend_window: 1h}}").detect
    memory, slow = detect.memory_params(), detect.slow_params()
    production = DetectParams(window=12 * 3600.0)
    assert memory == production.scaled(180)
    assert (memory.window, memory.warmup, memory.season, memory.horizon) == (240.0, 10.0, 480.0, 480.0)
    assert memory.min_buckets == production.min_buckets and memory.confidence == production.confidence
    assert slow == SlowParams(trend_window=3600.0).scaled(180)
    assert parse_config("").detect.time_scale == 1.0


def test_compressed_windows_without_the_history_the_store_keeps_are_refused_with_the_fix():
    """The four keys a lab would set: 5 s buckets need raw samples, and (season_days + 1) x season is
    8 days, past the 48 h raw retention; the store would answer with 1-minute rollups and the agent
    would be blind. The refusal says what to change."""
    with pytest.raises(ConfigError) as refused:
        parse_config("detect: {memory: {window: 2m, long_window: 8m, horizon: 30m, warmup: 20s}}")
    message = str(refused.value)
    assert "agent.raw_retention" in message and "8d1h" in message and "detect.time_scale" in message
    assert len(message.splitlines()) == 1
    # either fix is accepted
    parse_config(
        "agent: {raw_retention: 8d1h}\ndetect: {memory: {window: 2m, long_window: 8m, horizon: 30m, warmup: 20s}}"
    )
    parse_config("detect: {memory: {window: 2m, long_window: 8m, season: 5m, horizon: 30m, warmup: 20s}}")
    parse_config("detect: {time_scale: 180}")


def test_buckets_shorter_than_the_sampling_interval_are_refused():
    with pytest.raises(ConfigError, match=r"shorter than agent\.interval"):
        parse_config("agent: {interval: 5s}\ndetect: {time_scale: 1000}")
    parse_config("agent: {interval: 0.5s}\ndetect: {time_scale: 1000}")


def test_the_lab_example_passes_config_check_and_keeps_its_history_raw():
    done = subprocess.run(
        [PYTHON, "-m", "agent.cli.main", "config", "check", "--quiet", str(LAB)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    config = load_config(LAB)
    params = config.detect.memory_params()
    assert params.bucket == 5.0 and params.step == 20.0
    assert params.history <= config.agent.raw_retention and params.bucket >= config.agent.interval


@settings(max_examples=100, deadline=None)
@given(
    scale=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-10, 10**7),
        st.text(max_size=8),
        st.booleans(),
        st.none(),
    )
)
def test_any_time_scale_gives_a_config_or_a_config_error(scale):
    try:
        config = parse_config(
            yaml.safe_dump({"agent": {"interval": "0.05s"}, "detect": {"time_scale": scale}})
        )
    except ConfigError as exc:
        assert "detect.time_scale" in str(exc) or "detect" in str(exc)
    else:
        assert 1 <= config.detect.time_scale <= 100_000


@pytest.mark.slow
def test_a_real_agent_on_the_lab_config_finds_the_leak_of_its_example_instance(agent):
    """The lab example as written (its leaking instance included), with a stable neighbour."""
    lab = yaml.safe_load(LAB.read_text())
    leaky = next(i for i in lab["instances"] if i["name"] == "leaky")
    leaky["match"]["command"] = [PYTHON, *leaky["match"]["command"][1:]]  # this interpreter for python3
    stable = {
        "name": "stable",
        "match": {"command": workload_argv("stable", "--size", "16Mi")},
        "memory_limit": "256Mi",
    }
    config = {
        "agent": {k: v for k, v in lab["agent"].items() if k not in ("listen", "state_dir")},
        "detect": lab["detect"],
        "instances": [leaky, stable],
    }
    agent.start(config)
    wait_until(lambda: agent.get("/api/v1/findings", kind="leak")["findings"], 240, interval=1.0)
    findings = agent.get("/api/v1/findings")["findings"]
    leaks = [f for f in findings if f["kind"] == "leak"]
    assert [f["instance"] for f in leaks] == ["leaky"] and leaks[0]["verdict"] == "leak"
    assert not [f for f in findings if f["instance"] == "stable"]
    slope = leaks[0]["evidence"]["slope_bytes_per_second"]
    assert 1.0 * 2**20 < slope < 3.0 * 2**20, slope  # the example leaks 2 MiB/s
    assert "attribution" in leaks[0]["evidence"] and "suspects" in leaks[0]["evidence"]
