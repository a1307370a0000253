"""The `medic` command behaves like the tools it sits beside: global options anywhere, help on a bare
`medic`, the agent found through its state dir, bad URLs and unitless durations refused as usage
errors with a hint, shell completion, and JSON from the commands that print."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.cli import client
from agent.cli.main import COMMANDS, build_parser, main
from support.agent_runner import medic_cli
from support.procs import PYTHON, REPO

ENV_KEYS = ("MEDIC_URL", "MEDIC_TOKEN", "MEDIC_TOKEN_FILE", "MEDIC_STATE_DIR")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)  # no ./medic-state of the developer's


def captured_url(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the URL the CLI would call instead of calling it."""
    seen: list[str] = []
    build_parser()  # every command module imported first, so none keeps the fake after the test

    def fake_get(url: str, path: str, params=None, timeout: float = 5.0):
        seen.append(url)
        return {"instances": []}

    monkeypatch.setattr(client, "get_json", fake_get)
    import agent.cli.status

    monkeypatch.setattr(agent.cli.status, "get_json", fake_get)
    return seen


@pytest.mark.parametrize(
    "argv",
    [
        ["--url", "http://127.0.0.1:9999", "status"],
        ["status", "--url", "http://127.0.0.1:9999"],
        ["--json", "--url", "http://127.0.0.1:9999/", "status"],
        ["status", "--json", "--url", "http://127.0.0.1:9999"],
    ],
)
def test_global_options_before_or_after_the_subcommand(argv, monkeypatch, capsys):
    seen = captured_url(monkeypatch)
    assert main(argv) == 0
    assert seen == ["http://127.0.0.1:9999"]
    if "--json" in argv:
        assert json.loads(capsys.readouterr().out) == {"instances": []}


def test_a_value_given_before_is_kept_and_one_after_wins():
    parser = build_parser()
    args = parser.parse_args(["--json", "--state-dir", "a", "restart", "x", "--reason", "r"])
    assert args.json is True and args.state_dir == "a"
    args = parser.parse_args(["--state-dir", "a", "restart", "x", "--reason", "r", "--state-dir", "b"])
    assert args.state_dir == "b"
    args = parser.parse_args(["--json", "hook", "path"])  # nested subcommands share them too
    assert args.json is True
    assert parser.parse_args(["hook", "env", "--json"]).json is True
    assert parser.parse_args(["status"]).json is False


def test_medic_alone_prints_help_and_exits_0_and_a_usage_error_exits_2(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "usage: medic" in out and "completion" in out
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2


@pytest.mark.parametrize("url", ["not-a-url", "ftp://127.0.0.1:9464", "http://", "http://host:port"])
def test_a_malformed_url_is_a_usage_error_with_a_hint(url, capsys):
    assert main(["status", "--url", url]) == 2
    err = capsys.readouterr().err
    assert "expected e.g. http://127.0.0.1:9464" in err and "reach" not in err


def test_the_env_url_is_checked_too(monkeypatch, capsys):
    monkeypatch.setenv("MEDIC_URL", "localhost:9464")
    assert main(["plan"]) == 2
    assert "MEDIC_URL" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", "f.jsonl", "--window", "6"],
        ["analyze", "f.jsonl", "--horizon", "24"],
        ["pause", "--for", "30", "--reason", "x"],
        ["warmup", "x", "--deadline", "2"],
        ["demo", "--duration", "5"],
        ["run", "--interval", "1"],
        ["events", "--since", "6"],
        ["histo", "x", "--diff", "1"],
        ["heap", "x", "--base", "1.5"],
    ],
)
def test_a_bare_number_where_a_unit_is_expected_is_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    number = argv[argv.index(next(a for a in argv if a.replace(".", "").isdigit()))]
    assert f"give a unit: {number}s, {number}m or {number}h" in capsys.readouterr().err


def test_durations_with_units_zero_and_unix_times_pass():
    parser = build_parser()
    assert parser.parse_args(["analyze", "f", "--window", "6h"]).window == "6h"
    assert parser.parse_args(["demo", "--status-every", "0"]).status_every == "0"
    assert parser.parse_args(["events", "--since", "1700000000"]).since == "1700000000"
    assert parser.parse_args(["events", "--since", "2h"]).since == "2h"


def write_state(directory: Path, url: str, token: str | None = "t" * 32, mode: int = 0o600) -> None:
    directory.mkdir(mode=0o700, exist_ok=True)
    info = directory / "agent.json"
    info.write_text(json.dumps({"url": url, "pid": 1}))
    info.chmod(0o600)
    if token is not None:
        path = directory / "admin.token"
        path.write_text(token + "\n")
        path.chmod(mode)


def test_the_state_dir_gives_the_url_and_the_token(tmp_path, monkeypatch):
    state = tmp_path / "st"
    write_state(state, "http://127.0.0.1:9876")
    assert client.agent_url(None, str(state)) == "http://127.0.0.1:9876"
    assert client.admin_token(None, str(state)) == "t" * 32
    monkeypatch.setenv("MEDIC_STATE_DIR", str(state))
    assert client.agent_url(None, None) == "http://127.0.0.1:9876"
    monkeypatch.setenv("MEDIC_URL", "http://127.0.0.1:1111")  # explicit settings still win
    assert client.agent_url(None, None) == "http://127.0.0.1:1111"
    assert client.agent_url("http://127.0.0.1:2222", None) == "http://127.0.0.1:2222"
    monkeypatch.setenv("MEDIC_TOKEN", "from-env")
    assert client.admin_token(None, None) == "from-env"


def test_a_token_file_others_may_read_is_refused_with_the_fix(tmp_path, capsys):
    state = tmp_path / "st"
    write_state(state, "http://127.0.0.1:9", mode=0o644)
    assert main(["restart", "x", "--reason", "r", "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err
    assert "mode 0644" in err and f"chmod 600 {state / 'admin.token'}" in err


def test_a_state_dir_without_agent_json_says_so(tmp_path, capsys):
    assert main(["--state-dir", str(tmp_path / "none"), "status"]) == 2
    assert "agent.json does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_name_every_subcommand_and_shared_option(shell, capsys):
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    for name in COMMANDS:
        assert name in script
    for option in ("--url", "--token-file", "--state-dir", "--json", "--port", "--allocator"):
        assert option in script
    assert ("complete -F _medic medic" if shell == "bash" else "compdef _medic medic") in script
    if shell == "zsh" and shutil.which("zsh"):
        subprocess.run(["zsh", "-n"], input=script, text=True, check=True)


def bash_complete(script: str, words: list[str]) -> list[str]:
    program = (
        f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
        '_medic; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return done.stdout.split()


@pytest.mark.skipif(not shutil.which("bash"), reason="no bash")
def test_the_bash_completion_completes(capsys):
    main(["completion", "bash"])
    script = capsys.readouterr().out
    assert bash_complete(script, ["medic", "--url", "http://x", "sta"]) == ["status"]
    assert bash_complete(script, ["medic", "hook", "in"]) == ["install", "install-pth"]
    assert bash_complete(script, ["medic", "hook", "install", "--allocator", "j"]) == ["jemalloc"]
    assert "--reason" in bash_complete(script, ["medic", "restart", "--"])


def test_hook_subcommands_print_json(capsys, tmp_path):
    assert main(["hook", "env", "--python", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["MEDIC_HOOK_SOCKET"] == "auto"
    assert main(["--json", "hook", "install-pth", "--dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"path": str(tmp_path / "medic-hook.pth")}


def test_run_port_is_a_shorthand_for_listen():
    from agent.cli.run import build_config

    args = build_parser().parse_args(["run", "--port", "9511", "--pid", "1"])
    config, _, _ = build_config(args)
    assert config.agent.listen == "127.0.0.1:9511"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--port", "1", "--listen", "127.0.0.1:2"])


def test_a_real_agent_is_found_through_its_state_dir(agent, spawn, tmp_path):
    agent.state_dir = tmp_path / "elsewhere"  # not ./medic-state
    agent.start({"instances": []})
    status = medic_cli("--state-dir", str(agent.state_dir), "status", "--json")
    assert status.returncode == 0, status.stderr
    assert "instances" in json.loads(status.stdout)
    restart = medic_cli("restart", "nobody", "--reason", "x", "--state-dir", str(agent.state_dir))
    assert "needs the agent's admin token" not in restart.stderr
    assert restart.returncode == 4, restart.stderr  # the API's answer: no such instance


def test_run_json_prints_the_startup_line(spawn, tmp_path):
    import yaml

    from support.procs import wait_until

    state = tmp_path / "st"
    config = tmp_path / "medic.yaml"
    config.write_text(yaml.safe_dump({"agent": {"state_dir": str(state)}, "instances": []}))
    out = tmp_path / "out"
    with open(out, "wb") as handle:
        spawn(
            [PYTHON, "-m", "agent.cli.main", "run", "-c", str(config), "--port", "0", "--json"],
            stdout=handle,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    wait_until(lambda: out.read_text().strip(), 60)
    line = json.loads(out.read_text().splitlines()[0])
    assert line["state_dir"] == str(state) and line["url"].startswith("http://127.0.0.1:")
    assert isinstance(line["pid"], int)
