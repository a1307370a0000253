"""One time scale, `agent.time_scale`, for every duration medic judges or waits by: detection's and
remediation's, derived in one place, each window held at the probe intervals it judges; what runs in
real time left alone; a config that cannot judge refused with the fix; the lab example valid.
The real agents on the lab config are in tests/test_lab.py."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config.loader import load_config, parse_config
from agent.config.timescale import notes, scaled, time_axis
from agent.core.errors import ConfigError
from agent.core.timescale import STALE_SAMPLES, WINDOW_SAMPLES, TimeScale
from agent.detect.params import DetectParams
from agent.detect.slow.detector import slo_from_settings
from agent.detect.slow.rules import SlowParams
from remediation.budget import BudgetLimits, BudgetState, admit
from remediation.model import RestartRecord
from support.agent_runner import medic_cli
from support.procs import REPO

LAB = REPO / "examples" / "lab.yaml"


def test_the_time_scale_divides_every_detection_duration_given_or_default():
    """With a probe interval short enough for every floor, the scale is a plain division."""
    config = parse_config(
        "agent: {interval: 0.05s, time_scale: 180}\ndetect: {memory: {window: 12h}, slow: {trend_window: 1h}}"
    )
    axis = time_axis(config)
    production = DetectParams(window=12 * 3600.0)
    assert axis.memory == production.scaled(180)
    assert (axis.memory.window, axis.memory.warmup, axis.memory.season, axis.memory.horizon) == (
        240.0,
        10.0,
        480.0,
        480.0,
    )
    assert (
        axis.memory.min_buckets == production.min_buckets and axis.memory.confidence == production.confidence
    )
    assert axis.slow == SlowParams(trend_window=3600.0).scaled(180)
    assert (axis.slow.step, axis.slow.stale, axis.slow.peer_window) == (30 / 180, 0.5, 300 / 180)
    assert parse_config("").agent.time_scale == 1.0 and notes(parse_config("")) == []


def test_remediation_waits_are_on_the_same_axis_and_real_time_is_not():
    config = parse_config(
        "agent: {interval: 0.05s, time_scale: 60}\n"
        "remediation: {ladder: {escalation_expiry: 2h}, verify: {timeout: 2m, stable_for: 1s}}"
    )
    written, used = config.remediation, time_axis(config).remediation
    assert (used.budget.min_interval, used.budget.cooldown, used.limits().hour) == (10.0, 60.0, 60.0)
    assert (used.plan.safety_margin, used.plan.restart_duration, used.plan.deadline_granularity) == (60, 5, 5)
    assert (used.ladder.purge_settle, used.ladder.slow_confirm, used.ladder.clear_check) == (2.0, 2.0, 10.0)
    assert (used.ladder.crash_loop.window, used.ladder.crash_loop.reset_after) == (60.0, 30.0)
    assert used.ladder.escalation_expiry == 120.0 and used.blockers.min_uptime == 10.0
    assert used.ladder.crash_loop.max_restarts == written.ladder.crash_loop.max_restarts
    assert used.budget.max_per_hour == written.budget.max_per_hour  # a count: its hour is what shrinks
    # a restart's own timeouts, the coordinator's leases, the schedule: real time
    assert used.verify == written.verify and used.coordinator == written.coordinator
    assert used.interval == written.interval and used.evidence == written.evidence
    assert config.remediation.limits() == BudgetLimits(1, 600.0, 6, 3600.0, 3600.0)


def test_compressed_windows_are_held_at_the_samples_they_judge_and_said_so():
    """The lab's pair (time_scale 180, a 1 s probe interval): production's 90 s stale would be 0.5 s,
    shorter than the interval, so no window would ever be covered; the 5 min peer window and SLO
    `for` 1.7 s; open_after 2 at a 0.17 s step 0.33 s of evidence; the cause window with them."""
    config = load_config(LAB)
    axis = time_axis(config)
    slow, interval = axis.slow, config.agent.interval
    assert slow.stale == STALE_SAMPLES * interval
    assert slow.peer_window == WINDOW_SAMPLES * interval
    assert slow.open_after * slow.step >= 5 * interval and slow.step >= interval
    assert slow.trend_window >= slow.trend_buckets * interval
    ranker = next(spec for spec in config.instances if spec.name == "ranker")
    slo = slo_from_settings({"latency": ranker.latency.model_dump(by_alias=True)}, axis.scale)
    assert slo is not None and slo.window == WINDOW_SAMPLES * interval
    said = "\n".join(notes(config))
    for key in ("detect.slow.stale", "detect.slow.peer_window", "detect.slow.step", "latency.slo.for"):
        assert key in said
    assert "held at 3.0s" in said and "detect.memory" not in said  # its 5 s buckets need no hold
    assert axis.remediation.ladder.clear_check >= slow.peer_window + slow.open_after * slow.step


def test_a_memory_detector_too_compressed_for_the_interval_is_compressed_less_as_a_whole():
    """Its windows are tied (a season is a whole number of steps): 1000x at a 5 s interval would make
    0.9 s buckets, so all of them shrink 180x instead, and the note says how to get 1000x."""
    config = parse_config("agent: {interval: 5s, time_scale: 1000}")
    memory = time_axis(config).memory
    assert memory == DetectParams().scaled(180) and memory.bucket == 5.0
    assert memory.season / memory.step == DetectParams().season / DetectParams().step
    [said] = [n for n in notes(config) if n.startswith("detect.memory")]
    assert "compressed 180x, not 1000x" in said and "lower agent.interval to 900ms" in said


def test_real_time_schedules_slower_than_the_compressed_grid_they_serve_are_said():
    """The schedules are not scaled: at their defaults the compressed detectors would judge every 15 s
    and the engine step every 10 s against a 20 s safety margin. The lab sets both to 1 s."""
    said = notes(parse_config("agent: {interval: 1s, time_scale: 180}"))
    assert any(
        n.startswith("detect.interval (15s) is longer than the compressed judgement step (2.5s)")
        for n in said
    )
    assert any(n.startswith("remediation.interval (10s) is more than a quarter") for n in said)
    lab = notes(load_config(LAB))
    assert not [n for n in lab if n.startswith(("detect.interval", "remediation.interval"))]


def test_uncompressed_buckets_shorter_than_the_sampling_interval_are_refused():
    with pytest.raises(ConfigError, match=r"shorter than agent\.interval"):
        parse_config("agent: {interval: 5s}\ndetect: {memory: {window: 1m, long_window: 2m, season: 10m}}")
    parse_config("agent: {interval: 0.5s}\ndetect: {memory: {window: 1m, long_window: 2m, season: 10m}}")


def test_compressed_windows_without_the_history_the_store_keeps_are_refused_with_the_fix():
    """The four keys a lab would set: 5 s buckets need raw samples, and (season_days + 1) x season is
    8 days, past the 48 h raw retention; the store would answer with 1-minute rollups and the agent
    would be blind. The refusal says what to change."""
    with pytest.raises(ConfigError) as refused:
        parse_config("detect: {memory: {window: 2m, long_window: 8m, horizon: 30m, warmup: 20s}}")
    message = str(refused.value)
    assert "agent.raw_retention" in message and "8d1h" in message and "agent.time_scale" in message
    assert len(message.splitlines()) == 1
    parse_config(
        "agent: {raw_retention: 8d1h}\ndetect: {memory: {window: 2m, long_window: 8m, horizon: 30m, warmup: 20s}}"
    )
    parse_config("detect: {memory: {window: 2m, long_window: 8m, season: 5m, horizon: 30m, warmup: 20s}}")
    parse_config("agent: {time_scale: 180}")


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "detect: {slow: {stale: 2s}}",
            r"detect\.slow\.stale \(2\.0s\) is shorter than agent\.interval \(5\.0s\).*at least 15s",
        ),
        (
            "detect: {slow: {peer_window: 4s}}",
            r"detect\.slow\.peer_window \(4\.0s\).*at least 50s .*lower agent\.interval to 400ms",
        ),
        ("detect: {slow: {step: 1s}}", r"open_after x step \(2 x 1\.0s\).*one sample opens a finding"),
        (
            "instances: [{name: a, match: {pid: 1}, latency: {slo: {threshold: 100ms, for: 3s}}}]",
            r"instances\[0\]\.latency\.slo\.for \(3\.0s\) is shorter than agent\.interval",
        ),
        (
            "instances: [{name: a, match: {pid: 1}, latency: {canary: {url: 'http://127.0.0.1:9/', interval: 2m}}}]",
            r"instances\[0\]\.latency\.canary\.interval \(2m\) is longer than detect\.slow\.stale \(1m30s\)",
        ),
    ],
)
def test_a_window_shorter_than_its_samples_arrive_is_refused_with_the_fix(yaml_text, expected):
    with pytest.raises(ConfigError, match=expected) as refused:
        parse_config(f"agent: {{interval: 5s}}\n{yaml_text}")
    assert len(str(refused.value).splitlines()) == 1


def test_a_canary_slower_than_the_compressed_stale_limit_is_refused():
    """Compressed, `stale` is 3 probe intervals: a canary every 10 s would never be judged."""
    head = "agent: {interval: 1s, time_scale: 180}\ninstances: [{name: a, match: {pid: 1}, latency: "
    with pytest.raises(ConfigError, match=r"canary\.interval \(10s\).*\(3\.0s on agent\.time_scale 180\)"):
        parse_config(head + "{canary: {url: 'http://127.0.0.1:9/'}}}]")
    parse_config(head + "{canary: {url: 'http://127.0.0.1:9/', interval: 1s}}}]")


def test_detect_time_scale_is_refused_with_where_the_key_went():
    with pytest.raises(ConfigError) as refused:
        parse_config("detect: {time_scale: 180}")
    assert "detect.time_scale is now agent.time_scale" in str(refused.value)
    assert "agent: {time_scale: N}" in str(refused.value)


def test_the_max_per_hour_budget_counts_restarts_in_the_compressed_hour():
    """At 60x the hour of max_per_hour is a minute: two restarts a minute, not two in any real hour."""
    limits = BudgetLimits(max_concurrent=1, min_interval=0.0, max_per_hour=2, cooldown=0.0, hour=60.0)
    done = [RestartRecord(f"svc-{k}", "fleet", "a", 1000.0 + k, 1000.5 + k, "succeeded") for k in range(2)]
    state = BudgetState(done, now=1002.0)
    refused = admit(state, "fleet", "svc-9", 1002.0, limits)
    assert not refused.ok and "the hour (compressed to 1m)" in refused.reason
    assert refused.retry_at == 1060.0
    assert admit(state, "fleet", "svc-9", 1061.0, limits).ok


def test_the_lab_example_passes_config_check_and_lists_the_durations_it_uses():
    done = medic_cli("config", "check", str(LAB))
    assert done.returncode == 0, done.stderr
    assert "# agent.time_scale 180: durations below are production's" in done.stdout
    assert "#   detect.slow.stale: 1m30s -> 3.0s (held at its floor)" in done.stdout
    assert "#   remediation.plan.safety_margin: 1h -> 20s" in done.stdout
    assert "note: detect.slow.peer_window: 5m / 180 would be 1.7s, held at 10s" in done.stderr
    assert "warning" not in done.stderr
    config = load_config(LAB)
    params = time_axis(config).memory
    assert params.bucket == 5.0 and params.step == 20.0
    assert params.history <= config.agent.raw_retention and params.bucket >= config.agent.interval
    assert {item.key for item in scaled(config)} >= {"remediation.blockers.min_uptime", "detect.slow.horizon"}


@settings(max_examples=200, deadline=None)
@given(
    factor=st.floats(1, 100_000),
    interval=st.sampled_from([0.05, 0.2, 1.0, 5.0, 30.0]),
    stale=st.floats(0.01, 3600),
    window=st.floats(0.01, 3600),
)
def test_compression_stops_at_the_floor_and_never_lengthens(factor, interval, stale, window):
    """Any scale, any written value: at most the value as written, at least the scaled value, and at
    least the floor unless the value was written shorter than it."""
    slow = SlowParams(stale=stale, peer_window=window).scaled(TimeScale(factor, interval))
    for written, used, floor in (
        (stale, slow.stale, 3 * interval),
        (window, slow.peer_window, 10 * interval),
    ):
        assert written / factor * (1 - 1e-12) <= used <= written
        assert used >= min(written, floor) * (1 - 1e-12)
    memory = DetectParams().scaled(TimeScale(factor, interval))
    assert memory.bucket >= min(interval, DetectParams().bucket) * (1 - 1e-12)
    assert math.isclose(memory.season / memory.step, 24.0)


@settings(max_examples=100, deadline=None)
@given(
    scale=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-10, 10**7),
        st.text(max_size=8),
        st.booleans(),
        st.none(),
    ),
    interval=st.sampled_from(["0.05s", "1s", "5s"]),
)
def test_any_time_scale_gives_a_config_or_a_config_error(scale, interval):
    try:
        config = parse_config(yaml.safe_dump({"agent": {"interval": interval, "time_scale": scale}}))
    except ConfigError as exc:
        assert "agent.time_scale" in str(exc)
    else:
        assert 1 <= config.agent.time_scale <= 100_000
        axis = time_axis(config)
        least = config.agent.interval * (1 - 1e-9)
        assert axis.slow.stale >= least and axis.memory.bucket >= least
