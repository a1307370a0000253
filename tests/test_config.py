"""Config files: the commented example parses; every kind of mistake gives one clear line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.cli.main import main
from agent.config.detect import MemoryDetection, SlowDetection
from agent.config.loader import load_config, parse_config
from agent.core.errors import ConfigError
from agent.detect.latency_rules import SlowParams
from agent.detect.params import DetectParams

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "medic.yaml"


def test_commented_example_is_valid_and_complete():
    config = load_config(EXAMPLE)
    names = [i.name for i in config.instances]
    assert names == ["serving", "jvm-scorer", "onnx-0"]
    assert config.agent.interval == 5.0
    assert config.agent.raw_retention == 48 * 3600
    assert config.instances[1].memory_limit == 8 * 2**30
    assert config.instances[2].match.command == ["python3", "-m", "http.server", "8501"]


def test_the_detect_sections_are_the_detectors_params_key_for_key():
    """Every tunable of the detectors is a typed config key with the detector's own default."""
    assert set(MemoryDetection.model_fields) == {f.name for f in fields(DetectParams)}
    assert set(SlowDetection.model_fields) == {f.name for f in fields(SlowParams)}
    defaults = parse_config("").detect
    assert defaults.memory_params() == DetectParams()
    assert defaults.slow_params() == SlowParams()


def test_detect_sections_take_units_and_keep_defaults_for_empty_keys():
    config = parse_config(
        "detect: {memory: {window: 2h, warmup: , frag_min_bytes: 64Mi, min_buckets: '5'},"
        " slow: {peer_window: 10m, peer_floor: 5ms, trend_buckets: 8.0}}"
    )
    memory, slow = config.detect.memory_params(), config.detect.slow_params()
    assert (memory.window, memory.warmup, memory.frag_min_bytes, memory.min_buckets) == (
        7200.0,
        DetectParams().warmup,
        64.0 * 2**20,
        5,
    )
    assert (slow.peer_window, slow.peer_floor, slow.trend_buckets) == (600.0, 0.005, 8)


def test_empty_file_gives_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    config = load_config(path)
    assert config.agent.listen == "127.0.0.1:9464"
    assert config.instances == []


def test_command_string_is_split_not_run_by_a_shell():
    config = parse_config("instances: [{name: a, match: {command: 'sleep \"10 s\"; rm -rf /'}}]")
    assert config.instances[0].match.command == ["sleep", "10 s;", "rm", "-rf", "/"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("agent: {interval: 5x}", r"agent\.interval: expected a duration"),
        ("agent: {intervl: 5s}", r"agent\.intervl: unknown key"),
        ("agent: {listen: nowhere}", r"agent\.listen: expected HOST:PORT"),
        ("instances: [{name: a, match: {pid: abc}}]", r"instances\[0\]\.match\.pid: .*integer"),
        ("instances: [{name: a, match: {}}]", r"instances\[0\]\.match: give exactly one of"),
        ("instances: [{name: a, match: {pid: 1, cmdline: x}}]", r"got pid, cmdline"),
        ("instances: [{name: a, match: {cmdline: '(('}}]", r"invalid regular expression"),
        (
            "instances: [{name: a, match: {pid: 3}, memory_limit: 12Q}]",
            r"memory_limit: .*unknown size unit 'Q'",
        ),
        ("instances: [{name: 'a b', match: {pid: 3}}]", r"instances\[0\]\.name: expected letters"),
        ("instances: [{name: a, match: {pid: 3}}, {name: a, match: {pid: 4}}]", r"used twice"),
        ("instances: {name: a}", r"instances: .*list"),
        ("agent: [", r":1:9: invalid YAML"),
        ("- 1\n- 2", r"expected a mapping at the top level"),
    ],
)
def test_bad_config_gives_a_clear_line(tmp_path, text, expected, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(path)
    assert str(info.value).startswith(str(path))
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"medic: error: {path}")


def test_several_problems_give_one_line_each(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("agent: {interval: 5x, flush: 1s}\ninstances: [{name: a, match: {pid: -3}}]\n")
    assert main(["config", "check", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3
    assert any("agent.flush: unknown key" in line for line in lines)
    assert any("instances[0].match.pid" in line for line in lines)


@pytest.mark.parametrize("kind", ["missing", "directory", "binary"])
def test_unreadable_config_files(tmp_path, kind, capsys):
    path = tmp_path / "medic.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err
    assert {"missing": "file not found", "directory": "is a directory", "binary": "cannot read"}[kind] in err


def test_config_check_prints_effective_config_and_exit_code_from_a_real_process(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "config", "check", str(EXAMPLE)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert ok.returncode == 0, ok.stderr
    assert "interval: 5.0" in ok.stdout and "onnx-0" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent: {interval: soon}\n")
    failed = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "config", "check", str(bad)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert failed.returncode == 2
    assert failed.stderr.count("\n") == 1 and "agent.interval" in failed.stderr


yaml_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.floats(allow_nan=False)
)
yaml_values = st.recursive(
    yaml_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["agent", "instances", "x"]), yaml_values, max_size=3))
def test_any_structure_gives_a_config_or_a_config_error(data):
    import yaml

    try:
        parse_config(yaml.safe_dump(data))
    except ConfigError as exc:
        assert str(exc).startswith("<config>")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_gives_a_config_or_a_config_error(text):
    try:
        parse_config(text)
    except ConfigError:
        pass
