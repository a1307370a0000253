"""Config bounds: a duration or count too large for a timer is refused on load, in one clear line.

`lease_ttl: 999999999d` once passed validation and killed the coordinator's keep-alive thread
(`Event.wait` overflowed). Every duration now has a ceiling (a year) and the keys that need less have
their own; no value, however odd, reaches the loader's caller as anything but a `ConfigError`.
"""

from __future__ import annotations

import math
import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.config.loader import parse_config
from agent.core.errors import ConfigError
from agent.core.types import MAX_DURATION

LINE = re.compile(r"^<config>: [\w.\[\]]+: \S.*$")  # FILE: key.path: what was expected


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    lines = str(info.value).splitlines()
    assert all(LINE.match(line) for line in lines), lines
    return lines


def test_a_lease_ttl_of_a_billion_days_is_a_config_error_not_a_dead_thread():
    (line,) = problems("remediation: {coordinator: {lease_ttl: 999999999d}}")
    assert line.startswith("<config>: remediation.coordinator.lease_ttl: expected a duration of at most 365d")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("remediation: {coordinator: {lease_ttl: 2h}}", "coordinator.lease_ttl: must be between 2s and 1h"),
        (
            "remediation: {coordinator: {timeout: 10m}}",
            "coordinator.timeout: must be above 0s and at most 60s",
        ),
        ("remediation: {verify: {timeout: 0s}}", "verify.timeout: must be above 0s"),
        ("remediation: {budget: {max_concurrent: 1000000000}}", "budget.max_concurrent: "),
        ("remediation: {budget: {cooldown: 30d}}", "budget.cooldown: must be between 0s and 7d"),
        ("remediation: {evidence: {max_bytes: 1Ti}}", "evidence.max_bytes: must be between 0 and 64Gi"),
        (
            "remediation: {actuator: {type: exec, command: [x], timeout: 2d}}",
            "actuator.exec.timeout: must be above",
        ),
        ("agent: {interval: 2h}", "agent.interval: must be between 50ms and 1h"),
        ("agent: {raw_retention: 400d}", "agent.raw_retention: expected a duration of at most 365d"),
        ("detect: {interval: 10d}", "detect.interval: must be between 50ms and 1h"),
        (
            "detect: {memory: {window: 999999999d}}",
            "detect.memory.window: expected a duration of at most 365d",
        ),
        (
            "detect: {memory: {min_buckets: .inf}}",
            "detect.memory.min_buckets: Input should be a finite number",
        ),
        ("detect: {memory: {min_buckets: 1000000}}", "detect.memory.min_buckets: "),
        ("detect: {memory: {frag_ratio: .nan}}", "detect.memory.frag_ratio: "),
        (
            "detect: {memory: {window: 2h, long_window: 1h}}",
            "detect.memory: invalid detection parameters: long_window",
        ),
        ("detect: {slow: {open_after: 1.0e+30}}", "detect.slow.open_after: "),
        ("detect: {slow: {open_after: true}}", "detect.slow.open_after: expected a number"),
        (
            "detect: {slow: {peer_window: 9999999d}}",
            "detect.slow.peer_window: expected a duration of at most 365d",
        ),
        ("detect: {slow: {trend_buckets: 3}}", "detect.slow.trend_buckets: "),
        ("notify: {receiver: {max_body: 1Ti}}", "notify.receiver.max_body: must be between 1Ki and 64Mi"),
        ("notify: {retry: {cap: 2d}}", "notify.retry.cap: must be between 10ms and 1d"),
        ("instances: [{name: a, match: {pid: 99999999999}}]", "instances[0].match.pid: "),
        ("instances: [{name: a, match: {pid: 3}, hook: {timeout: 1h}}]", "hook.timeout: must be above 0s"),
        (
            "instances: [{name: a, match: {pid: 3}, stop_timeout: 2h}]",
            "stop_timeout: must be between 0s and 1h",
        ),
        (f"instances: [{{name: a, match: {{pid: 3}}, memory_limit: {'1' * 308}Ti}}]", "memory_limit: "),
    ],
)
def test_values_above_their_bound_name_the_key_and_the_bound(text, expected):
    assert any(expected in line for line in problems(text)), problems(text)


def test_every_problem_is_one_line():
    lines = problems(
        "agent: {interval: 99999999w, flush_interval: 2h}\nremediation: {coordinator: {lease_ttl: 1e300}}"
    )
    assert [line.split(": ")[1] for line in lines] == [
        "agent.interval",
        "agent.flush_interval",
        "remediation.coordinator.lease_ttl",
    ]


def test_the_year_long_ceiling_itself_is_accepted():
    config = parse_config("agent: {rollup_retention: 365d}\nremediation: {retention: 52w}")
    assert config.agent.rollup_retention == MAX_DURATION


DURATION_KEYS = [
    ("agent", "interval"),
    ("agent", "raw_retention"),
    ("detect", "interval"),
    ("remediation", "coordinator", "lease_ttl"),
    ("remediation", "coordinator", "timeout"),
    ("remediation", "plan", "restart_duration"),
    ("remediation", "budget", "max_per_hour"),
    ("remediation", "evidence", "max_bytes"),
    ("remediation", "verify", "timeout"),
    ("notify", "retry", "base"),
    ("notify", "receiver", "max_body"),
    ("detect", "memory", "window"),
    ("detect", "memory", "min_buckets"),
    ("detect", "memory", "frag_min_bytes"),
    ("detect", "memory", "confidence"),
    ("detect", "slow", "peer_window"),
    ("detect", "slow", "trend_buckets"),
    ("instances", "stop_timeout"),
    ("instances", "memory_limit"),
    ("instances", "match", "pid"),
]
_NUMBER = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1e308, 2**63, 2**64, 10**19]),
)
_TEXT = st.one_of(
    st.builds(
        lambda n, unit: f"{n}{unit}",
        st.one_of(
            st.integers(min_value=-(10**30), max_value=10**400), st.sampled_from(["1e400", "nan", "inf"])
        ),
        st.sampled_from(["", "ms", "s", "m", "h", "d", "w", "Ki", "Mi", "Gi", "Ti", "x", " "]),
    ),
    st.sampled_from(
        ["inf", "-inf", "nan", "NaN", ".inf", "1e999s", "9" * 400 + "d", "1" * 308 + "Ti", "", " "]
    ),
    st.text(max_size=20),
)
_VALUE = st.one_of(_NUMBER, _TEXT, st.booleans(), st.none(), st.lists(st.integers(), max_size=2))


def _document(key: tuple[str, ...], value: object) -> dict:
    if key[0] == "instances":
        instance: dict = {"name": "a", "match": {"pid": 3}}
        if key[1] == "match":
            instance["match"] = {"pid": value}
        else:
            instance[key[1]] = value
        return {"instances": [instance]}
    doc: dict = {}
    node = doc
    for part in key[:-1]:
        node = node.setdefault(part, {})
    node[key[-1]] = value
    return doc


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(DURATION_KEYS), _VALUE)
def test_no_duration_or_count_gives_a_traceback(key, value):
    """Huge numbers, inf, nan, negatives and garbage: a valid config or ConfigError lines, nothing else."""
    if isinstance(value, float) and math.isnan(value) and key[0] == "instances":
        value = ".nan"
    try:
        text = yaml.safe_dump(_document(key, value))
    except (OverflowError, ValueError):
        return  # yaml cannot write this value; nothing to load
    try:
        config = parse_config(text)
    except ConfigError as exc:
        assert all(LINE.match(line) or line.startswith("<config>: <top>") for line in str(exc).splitlines())
        return
    dumped = config.model_dump()
    for section in ("agent", "remediation", "notify"):
        _assert_bounded(dumped[section])


def _assert_bounded(node: object) -> None:
    if isinstance(node, dict):
        for child in node.values():
            _assert_bounded(child)
    elif isinstance(node, list):
        for child in node:
            _assert_bounded(child)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        assert math.isfinite(node) and node <= 2**50, node
