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
from agent.config.loader import load_config, parse_config, validate_config
from agent.core.errors import ConfigError
from agent.detect.params import DetectParams
from agent.detect.slow.rules import SlowParams

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


LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n" for prev, name in zip("abcdefgh", "bcdefghi")
)


@pytest.mark.parametrize(
    "text, expected",
    [
        (LAUGHS + "instances: *i\n", "expand to more than 100000 values"),  # a billion laughs
        ("instances: &a [*a]\n", "refer to themselves"),
        ("agent: &a {probes: *a}\n", "refer to themselves"),
        ("instances: " + "[" * 20000 + "]" * 20000 + "\n", "nests too deep"),
        ("instances: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", "nests too deep"),
    ],
)
def test_yaml_bombs_are_config_errors_at_once(text, expected):
    with pytest.raises(ConfigError, match=expected):
        parse_config(text)


def test_a_few_shared_anchors_still_work():
    config = parse_config(
        "instances:\n"
        + "".join(
            f"  - {{name: s{i}, match: {{pid: {i + 1}}}, labels: &l{i} {{fleet: ranker}}}}\n"
            for i in range(3)
        )
        + "  - {name: s9, match: {pid: 9}, labels: *l0}\n"
    )
    assert config.instances[-1].labels == {"fleet": "ranker"}


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_config_that_is_not_a_small_regular_file_is_refused_without_reading_it(tmp_path, kind, capsys):
    import os

    if kind == "fifo":  # no writer: opening it for reading used to block the start for ever
        path = tmp_path / "medic.yaml"
        os.mkfifo(path)
    elif kind == "device":  # never ends
        path = Path("/dev/zero")
    else:
        path = tmp_path / "medic.yaml"
        with path.open("w") as out:
            out.write("# padding\n" * (500_000))
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert {"fifo": "not a regular file", "device": "not a regular file", "huge": "holds more than"}[
        kind
    ] in err


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_secret_and_canary_body_files_that_are_fifos_or_devices_are_refused_at_once(tmp_path, kind):
    """A FIFO (no writer) would block the agent's start or the canary's thread for ever; a device never ends."""
    import os

    from agent.core.errors import ProbeError, UnsafePath
    from probes.canary import read_body
    from probes.linux.secrets import read_token

    path = tmp_path / "file"
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path = Path("/dev/zero")
    with pytest.raises(UnsafePath, match="not a regular file"):
        read_token(path, "notify.receiver.secret_file")
    with pytest.raises(ProbeError, match=r"not a regular file.*latency\.canary\.body_file"):
        read_body({"body_file": str(path)})


@st.composite
def aliased_yaml(draw) -> str:
    """Anchored lists and maps that alias earlier ones (and at times themselves), mounted somewhere."""
    lines = []
    for index in range(draw(st.integers(1, 8))):
        refs = [f"*n{draw(st.integers(0, index))}" for _ in range(draw(st.integers(0, 12)))]
        items = refs + draw(st.lists(st.sampled_from(["1", "x", "5s", "{}", "[]"]), max_size=3))
        if draw(st.booleans()):
            lines.append(f"k{index}: &n{index} [{', '.join(items)}]")
        else:
            lines.append(f"k{index}: &n{index} {{{', '.join(f'f{i}: {v}' for i, v in enumerate(items))}}}")
    key = draw(st.sampled_from(["instances", "agent", "detect", "notify", "x"]))
    return "\n".join(lines) + f"\n{key}: *n{draw(st.integers(0, len(lines) - 1))}\n"


@settings(max_examples=200, deadline=None)
@given(aliased_yaml())
def test_any_aliases_give_a_config_or_a_config_error_quickly(text):
    try:
        parse_config(text)
    except ConfigError as exc:
        assert "\n" not in str(exc) or all(line.startswith("<config>") for line in str(exc).splitlines())


@pytest.mark.parametrize(
    "matches",
    [
        [{"pid": 4242}, {"pid": 4242}],
        [{"pidfile": "/run/x.pid"}, {"pidfile": "/run/x.pid"}],
        [{"cmdline": "gunicorn"}, {"cmdline": "gunicorn"}],
    ],
)
def test_two_specs_on_one_pid_pidfile_or_regex_are_refused_at_load(matches) -> None:
    specs = [{"name": f"s{i}", "match": match} for i, match in enumerate(matches)]
    with pytest.raises(ConfigError) as refused:
        validate_config({"instances": specs}, "medic.yaml")
    assert "medic.yaml" in str(refused.value) and "'s0' and 's1' both match" in str(refused.value)


@pytest.mark.parametrize(
    "match, error",
    [
        ({"pid": 10, "max_children": 0}, "instances[0].match.max_children: "),
        ({"pid": 10, "max_children": 5000}, "less than or equal to 4096"),
        (
            {"pid": 10, "children": False, "max_children": 8},
            "max_children applies only with `children: true`",
        ),
        ({"pid": 10, "children": "sometimes"}, "instances[0].match.children: "),
    ],
)
def test_children_and_their_bound_are_checked_with_the_key_path(match, error) -> None:
    with pytest.raises(ConfigError) as refused:
        validate_config({"instances": [{"name": "svc", "match": match}]}, "medic.yaml")
    assert error in str(refused.value)


def test_workers_come_with_their_server_by_default() -> None:
    match = validate_config({"instances": [{"name": "svc", "match": {"pid": 10}}]}).instances[0].match
    assert (match.children, match.max_children) == (True, 256)
