"""`${ENV}` and `${ENV:-default}` in config values: expanded from the environment, never elsewhere,
and an unset variable is one clear line naming the key."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.config.loader import expand_env, parse_config
from agent.core.errors import ConfigError
from support.procs import REPO

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
VALUES = st.text(min_size=1, max_size=40)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=30))
TREES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)

CONFIG = """
instances:
  - name: ranker
    match: {cmdline: "model_server --port=8501$"}
    memory_limit: ${MEDIC_TEST_LIMIT}
    labels: {zone: "${MEDIC_TEST_ZONE:-zone-a}", cost: "$$5 ${MEDIC_TEST_COST:-}"}
"""


def test_a_limit_from_the_downward_api_and_defaults():
    env = {"MEDIC_TEST_LIMIT": "2147483648"}  # what resourceFieldRef limits.memory puts in the env
    config = parse_config(CONFIG, environ=env)
    (ranker,) = config.instances
    assert ranker.memory_limit == 2 * 2**30
    assert ranker.labels == {"zone": "zone-a", "cost": "$$5 "}
    assert ranker.match.cmdline == "model_server --port=8501$", "a regex's $ is not a reference"

    zoned = parse_config(CONFIG, environ={**env, "MEDIC_TEST_ZONE": "b", "MEDIC_TEST_COST": "1"})
    assert zoned.instances[0].labels == {"zone": "b", "cost": "$$5 1"}
    assert parse_config(CONFIG, environ={"MEDIC_TEST_LIMIT": "2Gi"}).instances[0].memory_limit == 2 * 2**30


def test_an_unset_variable_names_the_key_and_the_variable():
    with pytest.raises(ConfigError) as raised:
        parse_config(CONFIG, source="medic.yaml", environ={})
    assert str(raised.value) == (
        "medic.yaml: instances[0].memory_limit: environment variable MEDIC_TEST_LIMIT is not set "
        "(set it, or give a default: ${MEDIC_TEST_LIMIT:-VALUE})"
    )
    with pytest.raises(ConfigError, match="MEDIC_TEST_LIMIT is empty"):
        parse_config(CONFIG, environ={"MEDIC_TEST_LIMIT": ""})
    with pytest.raises(ConfigError, match=r"instances\[0\].memory_limit: expected .auto. .* or a size"):
        parse_config(CONFIG, environ={"MEDIC_TEST_LIMIT": "lots"})


def test_every_unset_variable_is_listed_at_once():
    with pytest.raises(ConfigError) as raised:
        expand_env({"a": "${ONE}", "b": ["x", "${TWO} and ${THREE:-3}"]}, {}, "f.yaml")
    lines = str(raised.value).splitlines()
    assert [line.split(": ")[1] for line in lines] == ["a", "b[1]"]
    assert "ONE" in lines[0] and "TWO" in lines[1]


def test_keys_and_non_strings_are_left_alone_and_dollar_dollar_is_literal():
    data = {"${KEY}": "${KEY}", "n": 5, "t": True, "none": None, "raw": "$$${KEY}", "lone": "$ $KEY ${"}
    assert expand_env(data, {"KEY": "v"}) == {
        "${KEY}": "v",
        "n": 5,
        "t": True,
        "none": None,
        "raw": "$${KEY}",
        "lone": "$ $KEY ${",
    }


@given(TREES)
def test_text_without_a_reference_is_unchanged(data):
    if "${" in repr(data):
        return
    assert expand_env(data, {}) == data


@given(NAMES, VALUES, st.text(max_size=10), st.text(max_size=10))
def test_a_reference_is_replaced_by_the_value_exactly_once(name, value, before, after):
    """The value is inserted as is: a `${…}` inside it is not expanded again."""
    if "$" in before + after or "{" in after:
        return
    text = f"{before}${{{name}}}{after}"
    assert expand_env([text], {name: value}) == [f"{before}{value}{after}"]
    assert expand_env([f"${{{name}:-fallback}}"], {}) == ["fallback"]
    assert expand_env([f"${{{name}:-fallback}}"], {name: value}) == [value]


@given(TREES, st.dictionaries(NAMES, st.text(max_size=20), max_size=4))
def test_any_data_gives_data_or_a_config_error(data, environ):
    try:
        expand_env(data, environ)
    except ConfigError as exc:
        assert "environment variable" in str(exc) or "characters" in str(exc)


def test_medic_config_check_expands_in_a_real_process(tmp_path):
    path = tmp_path / "medic.yaml"
    path.write_text(CONFIG)
    env = {**os.environ, "PYTHONPATH": str(REPO), "MEDIC_TEST_LIMIT": "1Gi"}
    env.pop("MEDIC_TEST_ZONE", None)
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "config", "check", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "memory_limit: 1073741824" in done.stdout and "zone: zone-a" in done.stdout
    env.pop("MEDIC_TEST_LIMIT")
    unset = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "config", "check", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert unset.returncode == 2 and "Traceback" not in unset.stderr
    assert "environment variable MEDIC_TEST_LIMIT is not set" in unset.stderr


SECRET = "xoxb-2718281828-k3y0fth3w0rkspac3"


@pytest.mark.parametrize(
    "text, key",
    [
        ("agent: {listen: '${SLACK_TOKEN}'}", "agent.listen"),  # a secret under the wrong key
        (
            "instances: [{name: a, match: {pid: 1}, memory_limit: '${SLACK_TOKEN}'}]",
            "instances[0].memory_limit",
        ),
        ("agent: {interval: 'every ${SLACK_TOKEN}'}", "agent.interval"),
        ("instances: [{name: a, match: {cmdline: '(${SLACK_TOKEN}'}}]", "instances[0].match.cmdline"),
        ("notify: {sinks: [{type: slack, url: '${SLACK_TOKEN}'}]}", "notify.sinks[0]"),
    ],
)
def test_a_config_error_names_the_key_and_the_reference_never_the_value(text, key):
    with pytest.raises(ConfigError) as raised:
        parse_config(text, source="medic.yaml", environ={"SLACK_TOKEN": SECRET})
    message = str(raised.value)
    assert message.startswith(f"medic.yaml: {key}") and "${SLACK_TOKEN}" in message
    assert SECRET not in message and SECRET[:12] not in message and "k3y0f" not in message


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=4, max_size=80))
def test_no_value_from_the_environment_is_ever_printed(secret):
    """Whatever the value, the lines of a config error never quote it (nor a cut of it)."""
    for text in (
        "agent: {listen: '${S}'}",
        "agent: {interval: '${S}'}",
        "instances: [{name: '${S}', match: {pid: 1}}]",
    ):
        try:
            parse_config(text, environ={"S": secret})
        except ConfigError as exc:
            assert secret not in str(exc) and secret[:12] not in str(exc), str(exc)


def test_a_key_given_twice_is_refused_with_both_lines():
    text = "agent:\n  interval: 5s\n  listen: 127.0.0.1:9464\n  interval: 1s\ninstances:\n  - {name: a, match: {pid: 1}, name: b}\n"
    with pytest.raises(ConfigError) as raised:
        parse_config(text, source="medic.yaml")
    assert str(raised.value).splitlines() == [
        "medic.yaml:4:3: key 'interval' is given twice in one mapping (first at line 2:3); YAML would "
        "keep only the last: remove one",
        "medic.yaml:6:32: key 'name' is given twice in one mapping (first at line 6:6); YAML would keep "
        "only the last: remove one",
    ]
    merged = "base: &base {interval: 5s}\nagent:\n  <<: *base\n  interval: 1s\n"
    with pytest.raises(
        ConfigError, match="base: unknown key"
    ):  # a merge may be overridden: only base is wrong
        parse_config(merged)
