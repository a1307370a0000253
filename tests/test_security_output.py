"""Control characters from others never reach a terminal raw: tables, lines and the agent's log escape them.

Process names, hook replies, pause reasons and alert labels are written by someone other than the
person reading `medic events`; an `ESC [2J` in them would clear the screen, an OSC rewrite the title,
a newline forge a log line. The text is shown escaped (`\\x1b[2J`); `--json` stays JSON.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from agent.cli.main import main
from agent.cli.run import PrintableFormatter
from agent.core.text import echo, printable, render
from support.procs import wait_until

ESC = "\x1b"
EVIL = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202eevil\r\nforged: line"


def test_printable_escapes_c0_c1_esc_and_bidi_but_keeps_text_and_spaces():
    assert printable("serving-7 zone b  ünïcode") == "serving-7 zone b  ünïcode"
    shown = printable(EVIL)
    assert shown == "\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\u202eevil\\r\\nforged: line"
    assert shown.isprintable()
    assert printable("a\nb\tc\x00", newlines=True) == "a\nb\tc\\x00"
    assert printable(printable(EVIL)) == printable(EVIL)  # escaping twice changes nothing


def test_tables_keep_one_row_per_line_and_align_on_the_escaped_text():
    table = render(["NAME", "N"], [["a\x1b[31m\nb", 1], ["plain", 22]], numeric={1})
    lines = table.splitlines()
    assert len(lines) == 3 and ESC not in table
    assert lines[1] == "a\\x1b[31m\\nb   1" and lines[2] == "plain" + " " * 9 + "22"


def test_echo_prints_lines_escaped(capsys):
    echo(f"first {EVIL}\nsecond")
    out = capsys.readouterr().out
    assert ESC not in out and "\r" not in out
    assert out.splitlines() == [
        "first \\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\u202eevil\\r",
        "forged: line",
        "second",
    ]


def test_log_lines_escape_messages_so_a_reason_cannot_forge_a_line():
    formatter = PrintableFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord("medic", logging.WARNING, __file__, 1, "paused: %s", (EVIL,), None)
    line = formatter.format(record)
    assert "\n" not in line and ESC not in line and line.startswith("WARNING paused: \\x1b[2J")
    try:
        raise ValueError(EVIL)
    except ValueError:
        record = logging.LogRecord("medic", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = formatter.format(record)
    assert ESC not in text and "Traceback (most recent call last):\n" in text


@pytest.mark.slow
def test_events_and_plan_show_a_hostile_pause_reason_and_process_name_escaped(agent, spawn, tmp_path: Path):
    first = spawn(["sleep", "300"])
    pidfile = tmp_path / "serve.pid"
    pidfile.write_text(f"{first.pid}\n")
    agent.start(
        {
            "agent": {"interval": "0.2s", "discovery_interval": "0.2s", "flush_interval": "0.3s"},
            "instances": [{"name": "serve", "match": {"pidfile": str(pidfile)}}],
            "remediation": {"mode": "dry-run"},
        }
    )
    wait_until(lambda: agent.instance("serve")["status"] == "up", 20)
    # the pidfile now names another program, whose file name (and so its comm and exe) is hostile
    impostor_path = tmp_path / "\x1b[2J\x1b[31mevil"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", impostor_path)
    before = time.time() - 5
    impostor = spawn([str(impostor_path), "300"])
    first.send_signal(signal.SIGKILL)
    first.wait()
    pidfile.write_text(f"{impostor.pid}\n")
    os.utime(pidfile, (before, before))  # dated before the impostor: no service manager wrote it for it
    wait_until(lambda: agent.events(kind="instance_down", instance="serve"), 20)

    token = (agent.state_dir / "admin.token").read_text().strip()
    reply = httpx.post(
        f"{agent.url}/api/v1/pause",
        json={"reason": f"maintenance {EVIL}", "duration": "10m"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert reply.status_code in (200, 400, 422), reply.text  # refusing control characters is safe too
    if reply.status_code == 200:
        wait_until(lambda: agent.events(kind="remediation_paused"), 10)

    events = agent.cli("events", "--limit", "200", token=False)
    plan = agent.cli("plan", token=False)
    assert events.returncode == 0 and plan.returncode == 0, events.stderr + plan.stderr
    for output in (events.stdout, plan.stdout, events.stderr, plan.stderr):
        assert ESC not in output and "\x9b" not in output and "\r" not in output
    assert "\\x1b[2J\\x1b[31mevil" in events.stdout  # the impostor, named and inert
    if reply.status_code == 200:
        assert "maintenance \\x1b[2J" in plan.stdout and "maintenance \\x1b[2J" in events.stdout
        assert not any(
            line.startswith("forged") for line in events.stdout.splitlines() + plan.stdout.splitlines()
        )

    as_json = agent.cli("events", "--limit", "200", "--json", token=False)
    assert ESC not in as_json.stdout
    messages = [e["message"] for e in json.loads(as_json.stdout)]
    assert any("\x1b[2J\x1b[31mevil" in m for m in messages)  # JSON keeps the text exact, escaped by JSON

    time.sleep(0.5)  # the agent's log lines for these events are flushed
    log = agent.log.read_text(encoding="utf-8", errors="replace")
    assert ESC not in log and "\x9b" not in log
    assert not any(line.startswith("forged") for line in log.splitlines())


def test_cli_error_lines_are_escaped(capsys):
    code = main(["config", "check", f"/nonexistent/{ESC}[2Jmedic.yaml"])
    err = capsys.readouterr().err
    assert code == 2 and ESC not in err and "\\x1b[2J" in err
