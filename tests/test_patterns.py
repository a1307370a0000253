"""Config regexes that read others' text are matched in linear time (RE2): a command line an
unprivileged process wrote, or an alert name from Prometheus, cannot stall the agent; a pattern RE2
cannot take is a config error that says how to write it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config.loader import parse_config
from agent.core.errors import ConfigError
from agent.core.patterns import PatternError, compile_pattern
from agent.watch.discovery import by_cmdline
from remediation.blockers import PrometheusAlerts
from support.procs import PYTHON, wait_until

# `re` backtracks on these: quadratic for A.*B over 720 KB (tens of seconds), exponential for the
# nested repetition over 40 x (longer than any test run); RE2 answers both at once
LONG_ARGS = ["A" * 120_000 for _ in range(6)]
NESTED = "x" * 40


@pytest.mark.parametrize(
    "pattern, says",
    [
        (r"(model)_server \1", "invalid escape sequence"),
        (r"server(?=--port)", "invalid perl operator"),
        ("serve(", "missing )"),
    ],
)
def test_a_pattern_re2_cannot_take_is_a_config_error_naming_the_key(pattern, says):
    text = f"instances: [{{name: a, match: {{cmdline: '{pattern}'}}}}]"
    with pytest.raises(ConfigError) as raised:
        parse_config(text, source="medic.yaml")
    message = str(raised.value)
    assert message.startswith("medic.yaml: instances[0].match.cmdline: invalid regular expression")
    assert says in message and "RE2" in message and "\n" not in message
    with pytest.raises(PatternError):
        compile_pattern(pattern)
    remediation = (
        f"remediation: {{blockers: {{prometheus: {{url: 'http://127.0.0.1:9', match: ['{pattern}']}}}}}}"
    )
    with pytest.raises(ConfigError, match=r"remediation\.blockers\.prometheus\.match: invalid regular"):
        parse_config(remediation)


def test_the_patterns_users_write_keep_their_meaning():
    assert compile_pattern(r"model_server --port=8501$").search("python model_server --port=8501")
    assert not compile_pattern(r"model_server --port=8501$").search("model_server --port=85011")
    assert compile_pattern(r"^java .*-Dapp=ranker\b").search("java -Xmx8g -Dapp=ranker -jar r.jar")
    assert compile_pattern("(?i)serving").search("TF SERVING")


def test_a_huge_command_line_written_by_anyone_does_not_stall_discovery(spawn):
    proc = spawn([PYTHON, "-c", "import time; time.sleep(120)", *LONG_ARGS, NESTED])
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    wait_until(lambda: cmdline.read_bytes().count(b"A") > 700_000, 10)  # exec'd, not still the fork
    assert proc.pid not in pids(by_cmdline("A.*B"))  # a whole-line scan with re took ~30 s here
    assert proc.pid not in pids(by_cmdline("(x+x+)+y"))  # exponential with re
    (found,) = [p for p in by_cmdline(f"A{{100}}.*{NESTED}$") if p.pid == proc.pid]
    assert found.pid == proc.pid


def pids(found: list) -> list[int]:
    return [identity.pid for identity in found]


def test_an_alert_name_is_matched_in_linear_time():
    alerts = PrometheusAlerts("http://127.0.0.1:9", match=["A.*B", "(x+x+)+y"], ignore=["Watch.*dog"])
    assert not alerts._blocks("A" * 500_000)
    assert not alerts._blocks(NESTED)
    assert alerts._blocks("A" * 100 + "B")
    assert not alerts._blocks("Watch" + "-" * 100_000 + "dog AB")
