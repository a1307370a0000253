"""The warm-up gate against a real server that is slow for its first requests, and `medic warmup`."""

from __future__ import annotations

import json
import socket

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.errors import ConfigError
from agent.jobs.warmup import WarmupRequest, load_requests, parse_http_request, replay_until_warm
from support.agent_runner import medic_cli
from support.latency_app import start_app
from support.procs import PATIENCE


def write_requests(directory) -> None:
    directory.mkdir()
    (directory / "01-predict.http").write_text(
        "# a recorded request\nPOST /work HTTP/1.1\nContent-Type: application/json\nX-Warmup: 1\n\n"
        '{"instances": [[1, 2, 3]]}\n'
    )
    (directory / "02-health.http").write_text("GET /work?probe=1\n")
    (directory / "03-body.json").write_text('{"instances": [[4, 5, 6]]}')
    (directory / ".hidden").write_text("ignored")


def test_request_files_are_loaded_in_name_order(tmp_path):
    write_requests(tmp_path / "req")
    first, second, third = load_requests(tmp_path / "req")
    assert (first.method, first.target, first.headers) == (
        "POST",
        "/work",
        {"Content-Type": "application/json", "X-Warmup": "1"},
    )
    assert first.body == b'{"instances": [[1, 2, 3]]}\n'
    assert (second.method, second.target, second.body) == ("GET", "/work?probe=1", None)
    assert (third.method, third.target, third.headers["Content-Type"]) == ("POST", "", "application/json")
    assert third.url("http://127.0.0.1:9/v1/predict") == "http://127.0.0.1:9/v1/predict"
    assert first.url("http://127.0.0.1:9/v1/predict") == "http://127.0.0.1:9/work"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"no request line"),
        ("FETCH /x\n", r":1: expected `METHOD TARGET \[HTTP/1.1\]`"),
        ("GET x\n", r"the target must be a path"),
        ("GET /x HTTP/1.1 extra\n", r"expected `METHOD TARGET"),
        ("POST /x\nno colon here\n\nbody", r":2: expected a header line"),
    ],
)
def test_bad_request_files_name_file_and_line(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_http_request(text, "warmup/bad.http")


def test_directory_problems(tmp_path):
    with pytest.raises(ConfigError, match="not a directory"):
        load_requests(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no request files"):
        load_requests(tmp_path / "empty")


@given(st.text(max_size=200))
@settings(max_examples=300)
def test_fuzz_request_parser_returns_or_raises_config_error(text):
    try:
        request = parse_http_request(text)
    except ConfigError as exc:
        assert str(exc).startswith("<request>")
    else:
        assert request.method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def test_gate_waits_out_a_slow_start(spawn):
    app = start_app(spawn, "--mode", "slowstart", "--slow-first", "4", "--slow", "0.25", "--base", "0.005")
    requests = [WarmupRequest("a", "GET", "/work"), WarmupRequest("b", "POST", "/work", {}, b"{}")]
    seen = []
    outcome = replay_until_warm(
        requests,
        app.url("/"),
        target=0.1,
        consecutive=3,
        deadline=10,
        on_request=lambda request, latency, error: seen.append((request.source, latency, error)),
    )
    assert outcome.warm and outcome.requests == 7 and outcome.streak == 3 and outcome.failures == 0
    assert [source for source, _, _ in seen] == ["a", "b", "a", "b", "a", "b", "a"]  # round robin
    assert all(latency >= 0.25 for _, latency, _ in seen[:4]) and all(
        latency < 0.1 for _, latency, _ in seen[4:]
    )
    assert "warm: 3 requests in a row answered within 100ms after 7 requests" in outcome.reason
    assert app.stats()["max_in_progress"] == 1  # one request at a time


def test_gate_gives_up_at_the_deadline(spawn):
    app = start_app(spawn, "--mode", "slowstart", "--slow-first", "1000", "--slow", "0.2")
    outcome = replay_until_warm([WarmupRequest("a", "GET", "/work")], app.url("/"), target=0.1, deadline=1.0)
    assert not outcome.warm and 3 <= outcome.requests <= 7 and 0.9 <= outcome.elapsed < 2.0 * PATIENCE
    assert "not warm within 1s" in outcome.reason and "at most 0 in a row within 100ms" in outcome.reason


def test_failures_break_the_streak_and_back_off(spawn):
    app = start_app(spawn)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    down = replay_until_warm(
        [WarmupRequest("a", "GET", "/")], f"http://127.0.0.1:{port}/", target=0.1, deadline=1.0
    )
    assert not down.warm and down.failures == down.requests and down.requests <= 6  # backed off, not hammered
    assert "cannot connect" in down.reason
    failing = replay_until_warm(
        [WarmupRequest("ok", "GET", "/work?ms=1"), WarmupRequest("bad", "GET", "/work?ms=1&fail=1")],
        app.url("/"),
        target=0.1,
        consecutive=2,
        deadline=1.0,
    )
    assert not failing.warm and failing.best_streak == 1 and "answered HTTP 500" in failing.reason


@pytest.mark.slow
def test_medic_warmup_command(spawn, tmp_path):
    app = start_app(spawn, "--mode", "slowstart", "--slow-first", "2", "--slow", "0.3", "--base", "0.005")
    write_requests(tmp_path / "req")
    warm = medic_cli(
        "warmup",
        "serving-0",
        "--requests",
        str(tmp_path / "req"),
        "--url",
        app.url("/work"),
        "--target",
        "100ms",
        "-k",
        "3",
        "--json",
    )
    assert warm.returncode == 0, warm.stderr
    body = json.loads(warm.stdout)
    assert body["warm"] and body["requests"] == 5 and body["url"] == app.url("/work")

    config = tmp_path / "medic.yaml"
    instance = {
        "name": "serving-0",
        "match": {"pid": app.proc.pid},
        "latency": {"canary": {"url": app.url("/work?ms=150")}, "slo": {"threshold": "50ms"}},
    }
    config.write_text(yaml.safe_dump({"instances": [instance]}))
    cold = medic_cli(
        "warmup",
        "serving-0",
        "--requests",
        str(tmp_path / "req"),
        "--deadline",
        "1s",
        env={"MEDIC_CONFIG": str(config)},
    )
    # target: the SLO's 50 ms; base URL: the canary's, which the .json body goes to and which takes 150 ms
    assert cold.returncode == 1
    assert cold.stderr.startswith("serving-0: not warm within 1s")
    unknown = medic_cli("warmup", "nope", "--requests", str(tmp_path / "req"), "--config", str(config))
    assert (
        unknown.returncode == 2 and "no instance 'nope'" in unknown.stderr and "serving-0" in unknown.stderr
    )
    no_url = medic_cli("warmup", "x", "--requests", str(tmp_path / "req"), "--target", "1s")
    assert no_url.returncode == 2 and "give --url" in no_url.stderr


def test_the_engines_gate_uses_the_instance_settings_and_says_what_is_missing(spawn, tmp_path):
    """`warmup_gate` as the agent installs it: URL and target from the instance's latency section."""
    import time

    from agent.config.model import LatencySpec
    from agent.jobs.warmup import warmup_gate
    from remediation.config import WarmupSection
    from remediation.model import InstanceView

    app = start_app(spawn, "--mode", "slowstart", "--slow-first", "4", "--slow", "0.25", "--base", "0.005")
    requests = tmp_path / "warm"
    requests.mkdir()
    (requests / "work.http").write_text("GET /work\n")
    spec = WarmupSection.model_validate({"requests": str(requests), "consecutive": 3, "deadline": "10s"})
    latency = LatencySpec.model_validate({"canary": {"url": app.url("/")}, "slo": {"threshold": "100ms"}})
    view = InstanceView("svc", 1, 1.0)
    warm = warmup_gate(lambda name: spec, lambda name: latency)(view, time.time() + 30)
    assert warm.ok and warm.code == "warm" and warm.data["requests"] == 7
    assert warm.data["target_seconds"] == 0.1 and warm.data["url"] == app.url("/")

    unknown = warmup_gate(lambda name: spec, lambda name: None)(view, time.time() + 30)
    assert not unknown.ok and unknown.code == "misconfigured"
    assert "latency.canary.url" in unknown.reason and "latency.slo" in unknown.reason
    missing = WarmupSection.model_validate({"requests": str(tmp_path / "none"), "target": "100ms"})
    gone = warmup_gate(lambda name: missing, lambda name: latency)(view, time.time() + 30)
    assert not gone.ok and "not a directory of request files" in gone.reason
    late = warmup_gate(lambda name: spec, lambda name: latency)(view, time.time() - 1)
    assert not late.ok and "no time left" in late.reason
