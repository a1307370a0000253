"""The `notify:` section: shorthand, defaults, secrets, and errors that say what to fix."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config.loader import parse_config, validate_config
from agent.core.errors import ConfigError, UnsafePath
from agent.notify.config import sink_names
from agent.notify.sinks import create_sinks


def test_list_shorthand_and_defaults():
    config = validate_config({"notify": [{"type": "alertmanager", "url": "http://127.0.0.1:9093/"}]})
    sink = config.notify.sinks[0]
    assert sink.url == "http://127.0.0.1:9093"  # trailing slash dropped: paths are appended
    assert sink.repost_interval == 60.0 and sink.silences and sink.silence_max == 1800.0
    assert config.notify.min_severity == "warning"
    assert config.notify.retry.max_attempts == 20
    assert config.notify.receiver.instance_labels == ["medic_instance", "instance", "name"]
    assert validate_config({}).notify.sinks == []


def test_full_section_from_yaml(tmp_path, monkeypatch):
    monkeypatch.setenv("HOOK_SECRET", "s3cret-s3cret-s3cret")
    monkeypatch.setenv("SLACK_URL", "https://hooks.slack.example/T/B/x")
    config = parse_config(
        """
notify:
  min_severity: error
  dashboard_url: "https://grafana.example/d/medic?var-name={instance}"
  retry: {base: 500ms, cap: 1m, max_attempts: 3, jitter: 0}
  sinks:
    - {type: alertmanager, url: "http://am:9093", repost_interval: 30s, silences: false}
    - {type: webhook, url: "https://hooks.example/medic", secret_env: HOOK_SECRET, min_severity: critical}
    - {type: webhook, name: audit, url: "https://audit.example/in", secret_env: HOOK_SECRET, kinds: [restart_done]}
    - {type: slack, url_env: SLACK_URL}
"""
    )
    notify = config.notify
    assert sink_names(notify.sinks) == ["alertmanager", "webhook-0", "audit", "slack"]
    assert notify.retry.base == 0.5 and notify.retry.cap == 60.0
    sinks = create_sinks(notify)
    try:
        assert [s.type for s in sinks] == ["alertmanager", "webhook", "webhook", "slack"]
        assert sinks[1].secret == "s3cret-s3cret-s3cret"
        assert sinks[3].url == "https://hooks.slack.example/T/B/x"
        assert sinks[2].wants("restart_done") and not sinks[2].wants("finding_opened")
        assert sinks[2].wants("remediation_restart_succeeded")  # the engine's name for restart_done
    finally:
        for sink in sinks:
            sink.close()


@pytest.mark.parametrize(
    ("notify", "expected"),
    [
        ([{"type": "pagerduty", "url": "http://x"}], "notify.sinks[0]"),
        ([{"type": "webhook", "url": "http://x"}], "give exactly one of secret_env or secret_file"),
        ([{"type": "alertmanager", "url": "ftp://x"}], "expected an http:// or https:// URL"),
        (
            [{"type": "alertmanager", "url": "http://x", "kinds": ["finding_opend"]}],
            "unknown event kind(s) finding_opend",
        ),
        ([{"type": "slack"}], "give exactly one of url or url_env"),
        (
            [
                {"type": "alertmanager", "url": "http://a"},
                {"type": "alertmanager", "url": "http://b", "name": "alertmanager-0"},
            ],
            "used twice",
        ),
        ({"min_severity": "loud"}, "notify.min_severity"),
        ({"retry": {"base": "0s"}}, "must be between"),
        ({"receiver": {"instance_labels": ["bad-label"]}}, "not Prometheus label names: bad-label"),
        ({"sinks": [], "colour": "red"}, "notify.colour: unknown key"),
        (
            {"runbook_url": "docs/runbooks.md#{alertname}"},
            "notify: runbook_url: expected an http:// or https:// URL",
        ),
        (
            {"dashboard_url": "grafana/{instance}"},
            "notify: dashboard_url: expected an http:// or https:// URL",
        ),
    ],
)
def test_errors_name_the_key_and_the_fix(notify, expected):
    with pytest.raises(ConfigError) as info:
        validate_config({"notify": notify}, "medic.yaml")
    assert expected in str(info.value)
    assert str(info.value).startswith("medic.yaml: ")


def test_secrets_resolve_at_start_with_clear_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("MISSING_SECRET", raising=False)
    missing = validate_config(
        {"notify": [{"type": "webhook", "url": "http://x", "secret_env": "MISSING_SECRET"}]}
    )
    with pytest.raises(
        ConfigError, match=r"notify.sinks\[0\].secret_env: the environment variable MISSING_SECRET is not set"
    ):
        create_sinks(missing.notify)

    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef-long-enough\n")
    os.chmod(secret, 0o644)
    loose = validate_config({"notify": [{"type": "webhook", "url": "http://x", "secret_file": str(secret)}]})
    with pytest.raises(
        UnsafePath,
        match=r"notify.sinks\[0\].secret_file .* readable or writable by others \(mode 0644\): run `chmod 600",
    ):
        create_sinks(loose.notify)
    os.chmod(secret, 0o600)
    [sink] = create_sinks(loose.notify)
    assert sink.secret == "0123456789abcdef-long-enough"
    sink.close()

    # read as every secret is (probes.linux.secrets): a symlink is not followed, the size is bounded
    link = tmp_path / "link"
    link.symlink_to(secret)
    for spec in (
        {"type": "webhook", "url": "http://x", "secret_file": str(link)},
        {"type": "alertmanager", "url": "http://x", "bearer_token_file": str(link)},
    ):
        with pytest.raises(UnsafePath, match="is a symlink: medic does not follow it"):
            create_sinks(validate_config({"notify": [spec]}).notify)
    big = tmp_path / "big"
    big.write_text("x" * 5000)
    os.chmod(big, 0o600)
    with pytest.raises(UnsafePath, match="over the 4096-byte limit"):
        create_sinks(
            validate_config(
                {"notify": [{"type": "webhook", "url": "http://x", "secret_file": str(big)}]}
            ).notify
        )

    short = tmp_path / "short"
    short.write_text("tiny")
    os.chmod(short, 0o600)
    with pytest.raises(ConfigError, match="fewer than 16 characters"):
        create_sinks(
            validate_config(
                {"notify": [{"type": "webhook", "url": "http://x", "secret_file": str(short)}]}
            ).notify
        )


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
        max_leaves=10,
    )
)
def test_any_notify_value_either_validates_or_raises_config_error(value):
    try:
        validate_config({"notify": value})
    except ConfigError as exc:
        assert str(exc).startswith("<config>: ")


def test_the_agent_label_and_the_link_of_alerts():
    """`agent.name` names the agent in alerts; by default the pod (the Downward API's POD_NAME), then
    HOSTNAME; `agent.external_url` is where alerts link to, unset by default (no loopback links)."""
    agent = validate_config({}).agent
    assert agent.name is None and agent.external_url is None
    assert agent.agent_name({"POD_NAME": "ranker-7f9c", "HOSTNAME": "x"}) == "ranker-7f9c"
    assert agent.agent_name({"HOSTNAME": "ranker-7f9c"}) == "ranker-7f9c"
    assert agent.agent_name({}) == __import__("socket").gethostname()
    named = validate_config(
        {"agent": {"name": "pod-a", "external_url": "https://medic.example/ranker/"}}
    ).agent
    assert named.agent_name({"POD_NAME": "other"}) == "pod-a"
    assert named.external_url == "https://medic.example/ranker/"
    assert validate_config({"agent": {"external_url": "https://medic.example/"}}).agent.external_url == (
        "https://medic.example"
    )
    for bad, message in (
        ({"name": " a"}, "agent.name: expected a printable name"),
        ({"external_url": "x"}, "agent.external_url"),
    ):
        with pytest.raises(ConfigError, match=message):
            validate_config({"agent": bad})
