"""Every agent-facing command, pointed at something that is not a medic agent (a fake server on
loopback answering any JSON, deep JSON, endless or dripping answers), ends with one error line and
exit code 3 or 4: never a traceback, never unbounded memory, never a hang.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.cli import client
from agent.cli.main import main
from support.procs import PATIENCE
from support.remediation import HttpRecorder, dripping_server

COMMANDS = [
    ["status"],
    ["leaks"],
    ["plan"],
    ["events"],
    ["events", "--outbox"],
    ["actions"],
    ["histo", "serving"],
    ["heap", "serving"],
    ["evidence", "1"],
    ["evidence", "1", "finding"],
    ["doctor", "serving"],
    ["pause", "--for", "1h", "--reason", "x"],
    ["resume"],
    ["restart", "serving", "--reason", "x"],
    ["purge", "serving"],
    ["clear", "serving"],
]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "now",
                    "instances",
                    "findings",
                    "events",
                    "plan",
                    "actions",
                    "action",
                    "status",
                    "name",
                    "kind",
                    "error",
                    "suspects",
                    "rows",
                    "sinks",
                    "accepted",
                    "purge",
                    "resumed",
                    "paused",
                    "evidence",
                    "content",
                    "latest",
                    "mode",
                    "instance",
                    "x",
                ]
            ),
            inner,
            max_size=6,
        )
    ),
    max_leaves=16,
)


@pytest.fixture(scope="module")
def fake_agent() -> Iterator[HttpRecorder]:
    """A fake agent (a loopback HTTP server, not medic) whose every path answers what the test sets."""
    with HttpRecorder() as server:
        yield server


def run_cli(url: str, argv: list[str], capsys, monkeypatch) -> tuple[int, str]:
    monkeypatch.setenv("MEDIC_TOKEN", "0123456789abcdef0123")
    code = main(["--url", url, *argv])
    return code, capsys.readouterr().err


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=JSON, status=st.sampled_from([200, 200, 404, 500]), argv=st.sampled_from(COMMANDS))
def test_any_json_answer_is_an_output_or_one_error_line(
    fake_agent, capsys, monkeypatch, answer, status, argv
):
    fake_agent.fallback = (status, json.dumps(answer).encode(), 0.0)
    try:
        code = run_cli(fake_agent.url, argv, capsys, monkeypatch)[0]
    except SystemExit as exc:  # argparse and the like: a usage problem, said on stderr
        code = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert code in (0, 1, 2, 3, 4), (argv, answer, code)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_deep_json_is_an_api_error_not_a_recursion_error(fake_agent, capsys, monkeypatch, argv):
    fake_agent.fallback = (200, b"[" * 100_000 + b"]" * 100_000, 0.0)
    code, err = run_cli(fake_agent.url, argv, capsys, monkeypatch)
    assert code == 4 and "non-JSON" in err


def test_a_json_list_is_not_taken_for_an_answer(fake_agent, capsys, monkeypatch):
    fake_agent.fallback = (200, b"[1, 2, 3]", 0.0)
    code, err = run_cli(fake_agent.url, ["status"], capsys, monkeypatch)
    assert code == 4 and "JSON list" in err


def test_an_answer_of_the_wrong_shape_names_the_version(fake_agent, capsys, monkeypatch):
    fake_agent.fallback = (200, b'{"instances": 5}', 0.0)
    code, err = run_cli(fake_agent.url, ["status"], capsys, monkeypatch)
    assert code == 4 and "medic agent of version" in err and err.count("\n") == 1


def test_an_endless_answer_stops_at_the_reply_bound(capsys, monkeypatch):
    monkeypatch.setattr(client, "MAX_REPLY_BYTES", 4 * 2**20)
    with dripping_server(0.0, b'{"name": "x"},' * 4096) as url:
        code, err = run_cli(url, ["status"], capsys, monkeypatch)
    assert code == 4 and "answered more than 4 MiB" in err


def test_a_dripping_answer_stops_at_the_deadline(capsys, monkeypatch):
    monkeypatch.setattr(client, "REPLY_DEADLINE_FACTOR", 0.2)  # 1 s for the 5 s read timeout of status
    with dripping_server(0.1, b" ") as url:
        started = time.monotonic()
        code, err = run_cli(url, ["status"], capsys, monkeypatch)
    assert code == 3 and "still sending its answer" in err
    assert time.monotonic() - started < 4 * PATIENCE
