"""What `medic run` keeps out of its RSS: modules it loads only when something configured needs them.

The figures are in benchmarks/footprint.py; these tests guard the imports that make them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli.main import COMMANDS, build_parser, chosen_command

REPO = Path(__file__).resolve().parent.parent
LATE = ("httpx", "pydantic.v1")


def _loaded_after(code: str) -> list[str]:
    """Modules of interest a fresh interpreter holds after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO, timeout=60
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_agent_starts_without_httpx_or_the_other_subcommands():
    loaded = _loaded_after(
        "from agent.cli.main import build_parser, chosen_command\n"
        "build_parser(chosen_command(['run', '--port', '0']))\n"
        "import agent.runtime, agent.config.loader\n"
        "from probes.registry import PROBES, create_probe\n"
        "[create_probe(name) for name, entry in PROBES.items() if entry.default_enabled]"
    )
    assert [name for name in LATE if name in loaded] == []
    others = [module for name, module in COMMANDS.items() if name != "run" and module in loaded]
    assert others == []


def test_medic_run_builds_its_demo_without_the_demo_extra():
    """`make run` installs medic without numpy and onnxruntime (the `demo` extra): the built-in
    demo's instances are made from what that install has."""
    blocked = "import sys\nfor name in ('numpy', 'onnx', 'onnxruntime'):\n    sys.modules[name] = None\n"
    loaded = _loaded_after(blocked + "from agent.cli.run import demo_instances\nassert demo_instances()")
    assert "agent.demo.fleet" in loaded and "agent.demo.load" not in loaded


def test_a_configured_sink_still_loads_httpx_when_it_is_built():
    loaded = _loaded_after(
        "from types import SimpleNamespace\n"
        "from agent.notify.sinks.base import HttpSink\n"
        "HttpSink('hook', SimpleNamespace(timeout=1.0)).close()"
    )
    assert "httpx" in loaded


@pytest.mark.parametrize(
    "argv, command",
    [
        (["run"], "run"),
        (["--url", "http://127.0.0.1:1", "status"], "status"),
        (["--url=http://127.0.0.1:1", "--json", "leaks"], "leaks"),
        (["status", "--url", "run"], "status"),
        (["--url", "run"], None),  # `run` is the URL here, and no subcommand follows
        (["--state", "run", "status"], None),  # an abbreviated option: the whole parser decides
        (["-h"], None),
        (["--version"], None),
        (["bogus"], None),
        ([], None),
    ],
)
def test_the_subcommand_is_told_only_when_nothing_before_it_can_change_it(argv, command):
    assert chosen_command(argv) == command


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--port", "9511", "--pid", "1"],
        ["--url", "http://127.0.0.1:1", "status"],
        ["--json", "events", "--limit", "5"],
        ["leaks", "--state-dir", "/tmp/x"],
    ],
)
def test_the_narrowed_parser_reads_what_the_whole_one_reads(argv):
    whole = vars(build_parser().parse_args(argv))
    narrowed = vars(build_parser(chosen_command(argv)).parse_args(argv))
    assert narrowed == whole


def _mmapped_blocks_while_reallocating(tune: bool) -> list[int]:
    """mallinfo2's count of mmapped blocks while a 2 MiB buffer is allocated, freed and allocated again
    (larger than any free chunk a fresh interpreter's heap holds, whatever its hash seed left there)."""
    code = (
        "import json\nfrom medic_hook.glibc import GlibcMalloc\nfrom native_hooks.glibc import tune_agent_allocator\n"
        f"applied = tune_agent_allocator() if {tune} else True\n"
        "warm = bytearray(4 * 2**20)\ndel warm\n"  # what glibc's dynamic threshold learns from: a 4 MiB free
        "g = GlibcMalloc.find()\nbase = g.mallinfo2()['hblks']\nseen = []\n"
        "for _ in range(2):\n"
        "    block = bytearray(2 * 2**20)\n    seen.append(g.mallinfo2()['hblks'] - base)\n    del block\n"
        "print(json.dumps([int(applied), *seen]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=60,
        env=env,
    )
    return json.loads(done.stdout)


def test_the_agents_allocator_returns_per_tick_buffers_to_the_kernel():
    # glibc's default raises its mmap threshold each time a large mapped block is freed (here a 4 MiB
    # one first), so the next such blocks stay in the heap; the agent's fixed threshold maps (and
    # unmaps) each of them
    assert _mmapped_blocks_while_reallocating(tune=False) == [1, 0, 0]
    assert _mmapped_blocks_while_reallocating(tune=True) == [1, 1, 1]


def test_medic_analyze_judges_a_recording_without_loading_pydantic():
    """The detectors name their severities and kinds only for the type checker: `medic analyze`
    (and every CLI command that reads findings) starts without pydantic's 35 ms and 4 MiB."""
    loaded = _loaded_after(
        "from agent.cli.main import main\n"
        "main(['analyze', 'benchmarks/detection/corpus/py-cache-warmup.jsonl.gz', '--limit', '1Gi', '--json'])"
    )
    assert "agent.detect.memory.fleet" in loaded
    assert not [name for name in loaded if name.split(".")[0] == "pydantic"]
