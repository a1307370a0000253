"""The `remediation:` config section: the commented example parses, defaults are safe, mistakes are explained."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from remediation.config import RemediationSection
from remediation.coordinator import create_coordinator
from remediation.errors import RemediationError

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "remediation.yaml"


def section(data: dict) -> RemediationSection:
    return RemediationSection.model_validate(data)


def problems(data: dict) -> str:
    with pytest.raises(ValidationError) as info:
        section(data)
    return str(info.value)


def test_commented_example_is_valid_and_matches_the_defaults():
    data = yaml.safe_load(EXAMPLE.read_text())["remediation"]
    parsed = section(data)
    defaults = RemediationSection()
    assert parsed.mode == defaults.mode == "dry-run"
    assert (
        parsed.budget == defaults.budget and parsed.plan == defaults.plan and parsed.ladder == defaults.ladder
    )
    assert parsed.coordinator == defaults.coordinator and parsed.verify == defaults.verify
    assert parsed.instances["serving"].actuator.command == ["kubectl", "delete", "pod", "{instance}"]
    assert parsed.instances["serving"].drain.settle == 10


def test_defaults_are_the_cautious_ones():
    s = RemediationSection()
    assert s.mode == "dry-run"
    limits = s.limits()
    assert (limits.max_concurrent, limits.min_interval, limits.max_per_hour, limits.cooldown) == (
        1,
        600,
        6,
        3600,
    )
    assert s.coordinator.backend == "local" and s.blockers.capacity.max_unavailable == 1
    assert s.time_windows().describe() == "any time"


def test_durations_sizes_and_conversions():
    s = section(
        {
            "budget": {"min_interval": "90s", "cooldown": "2h", "max_per_hour": None},
            "plan": {"safety_margin": "30m", "restart_duration": "2m"},
            "ladder": {"crash_loop": {"max_restarts": 5, "window": "2h", "reset_after": "1h"}},
            "evidence": {"max_bytes": "1Mi"},
            "windows": [{"days": "mon-fri", "start": "02:00", "end": "06:00", "timezone": "Europe/Paris"}],
        }
    )
    assert s.limits().min_interval == 90 and s.limits().max_per_hour is None
    assert s.plan_settings().safety_margin == 1800 and s.plan_settings().restart_duration == 120
    assert s.ladder_settings().crash_loop_restarts == 5 and s.ladder_settings().crash_loop_reset_after == 3600
    assert s.evidence.max_bytes == 2**20
    assert "Europe/Paris" in s.time_windows().describe()


def test_kubernetes_backend_is_refused_with_the_way_forward():
    text = problems({"coordinator": {"backend": "kubernetes"}})
    assert "coordinator.backend" in text and "not implemented yet" in text
    assert "docs/remediation.md" in text and "use backend: etcd" in text


def test_factory_refuses_kubernetes_too(tmp_path):
    sneaky = RemediationSection().coordinator.model_construct(backend="kubernetes")
    with pytest.raises(RemediationError, match="not implemented yet"):
        create_coordinator(sneaky, state_dir=tmp_path, retention=3600)


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"mode": "yolo"}, "mode"),
        ({"budget": {"max_concurrent": 0}}, "max_concurrent"),
        ({"budget": {"min_interval": "soon"}}, "expected a duration"),
        ({"budget": {"surprise": 1}}, "Extra inputs"),
        ({"coordinator": {"lease_ttl": "1s"}}, "between 2s and 1h"),
        ({"coordinator": {"namespace": "a b"}}, "namespace"),
        ({"coordinator": {"etcd": {"endpoints": ["127.0.0.1:2379"]}}}, "expected endpoints such as"),
        ({"coordinator": {"etcd": {"endpoints": []}}}, "endpoints"),
        ({"coordinator": {"etcd": {"prefix": "medic/"}}}, "key prefix"),
        ({"windows": [{"start": "25:00", "end": "03:00"}]}, "not a time of day"),
        ({"windows": [{"start": "02:00", "end": "03:00", "timezone": "Mars/Base"}]}, "IANA"),
        ({"windows": [{"start": "02:00", "end": "03:00", "days": "someday"}]}, "unknown day"),
        ({"actuator": {"type": "teleport"}}, "actuator"),
        ({"actuator": {"type": "exec", "command": []}}, "command"),
        ({"actuator": {"type": "exec", "command": ["kill", "{pidd}"]}}, "unknown placeholder"),
        ({"actuator": {"type": "exec", "command": ["echo", "{"]}}, "literal braces"),
        ({"actuator": {"type": "http", "url": "ftp://x"}}, "http:// or https://"),
        ({"actuator": {"type": "signal", "signal": "STOP"}}, "signal"),
        ({"drain": {"timeout": "5s"}}, "exactly one of http"),
        ({"drain": {"http": "http://x/drain", "command": ["a"]}}, "exactly one of http"),
        (
            {"blockers": {"prometheus": {"url": "http://p:9090", "match": ["("]}}},
            "invalid regular expression",
        ),
        ({"blockers": {"capacity": {"min_ready_fraction": 1.5}}}, "min_ready_fraction"),
        ({"plan": {"restart_duration": 0}}, "above 0s"),
        ({"interval": "1ms"}, "between 50ms and 1h"),
    ],
)
def test_mistakes_name_the_key_and_the_fix(data, expected):
    assert expected in problems(data)


def test_per_instance_overrides_and_exclusions():
    s = section({"exclude": ["a"], "instances": {"b": {"exclude": True}, "c": {"verify": {"timeout": "1m"}}}})
    assert s.excluded("a") and s.excluded("b") and not s.excluded("c")
    assert s.for_instance("c").verify.timeout == 60 and s.for_instance("zzz").actuator is None


settings_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-5, 10**6), st.text(max_size=8), st.floats(allow_nan=True)
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=8,
)
keys = st.sampled_from(
    ["mode", "budget", "plan", "ladder", "coordinator", "blockers", "windows", "evidence", "actuator", "drain",
     "verify", "instances", "exclude", "interval", "retention", "bogus"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, settings_values, max_size=4))
def test_fuzz_any_mapping_is_either_valid_or_a_validation_error(data):
    try:
        parsed = section(data)
    except ValidationError as exc:
        assert exc.errors()
    else:
        parsed.limits(), parsed.plan_settings(), parsed.ladder_settings(), parsed.time_windows()
