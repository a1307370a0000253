"""The in-process hook never takes over a target's modules: it is one stdlib-only package, `medic_hook`,
started by the `.pth` line `medic hook install-pth` writes, and a Python target with packages of its
own named like ours (`agent`, `probes`) keeps them.

The targets run in a real virtualenv laid out as `pip install sidecar-medic` lays out site-packages:
`medic_hook/` at the top, medic's packages importable (a `.pth` pointing at this checkout, processed
before `medic-hook.pth`), and the `.pth` line written by the real CLI.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from native_hooks.client import HookClient
from support.procs import REPO, wait_until

OURS = ("agent", "probes", "remediation", "native_hooks", "dashboards")

TARGET = """
import json, os, sys, threading
import agent, probes
OURS = tuple(json.loads(sys.argv[1]))
print(json.dumps({"pid": os.getpid(), "agent": agent.MARKER, "probes": probes.MARKER}), flush=True)
sys.stdin.readline()
ours = sorted(n for n in sys.modules if n.split(".")[0] in OURS or n.startswith("medic"))
files = {n: getattr(sys.modules[n], "__file__", None) for n in ours}
threads = sorted((t.name, t.daemon) for t in threading.enumerate())
print(json.dumps({"modules": files, "threads": threads}), flush=True)
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(python, site-packages) of a fresh virtualenv with medic installed and the hook's .pth written."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    shutil.copytree(REPO / "medic_hook", site / "medic_hook", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "_medic_packages.pth").write_text(f"{REPO}\n")  # medic's packages, as an install has them
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "hook", "install-pth", "--dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return python, site


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """A target's own code: packages named `agent` and `probes`, first on its PYTHONPATH."""
    for name in ("agent", "probes"):
        (tmp_path / "app" / name).mkdir(parents=True)
        (tmp_path / "app" / name / "__init__.py").write_text(f"MARKER = 'the target own {name}'\n")
    return tmp_path / "app"


def target_env(app: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MEDIC_", "PYTHON", "VIRTUAL_ENV", "LD_PRELOAD", "MALLOC_CONF"))
    }
    return {**env, "PYTHONPATH": str(app), **extra}


def test_medic_hook_imports_only_the_standard_library_and_itself() -> None:
    imported = set()
    for source in (REPO / "medic_hook").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{source.name}: import the hook's modules as medic_hook.<name>"
                imported.add((node.module or "").split(".")[0])
    foreign = imported - set(sys.stdlib_module_names) - {"medic_hook"}
    assert imported and not foreign, foreign
    assert "ctypes" in imported  # the allocator bindings are inside it


def test_a_target_keeps_its_own_agent_and_probes_and_sees_only_medic_hook(
    venv: tuple[Path, Path], app: Path, sock_dir: str, spawn
) -> None:
    python, site = venv
    env = target_env(app, MEDIC_HOOK_SOCKET=f"{sock_dir}/t.%p.sock")
    proc = spawn(
        [str(python), "-c", TARGET, json.dumps(OURS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=app,
    )
    ready = json.loads(proc.stdout.readline())
    assert ready["agent"] == "the target own agent" and ready["probes"] == "the target own probes"
    path = f"{sock_dir}/t.{ready['pid']}.sock"
    wait_until(lambda: os.path.exists(path), timeout=10)
    with HookClient(path, timeout=5) as client:
        stats = client.request("stats")
        histogram = client.request("histogram", top=5)
    assert stats["hook"] == "python" and stats["pid"] == ready["pid"] and stats["allocator"] == "glibc"
    assert len(histogram["types"]) == 5

    proc.stdin.write("\n")
    proc.stdin.flush()
    seen = json.loads(proc.stdout.readline())
    modules = seen["modules"]
    assert modules["medic_hook"] == str(site / "medic_hook" / "__init__.py")
    hook = {name: where for name, where in modules.items() if name.split(".")[0] == "medic_hook"}
    assert all(where.startswith(str(site / "medic_hook")) for where in hook.values()), hook
    foreign = {name: where for name, where in modules.items() if name not in hook}
    assert sorted(foreign) == ["agent", "probes"]  # the target's own, nothing else of ours
    assert all(where.startswith(str(app)) for where in foreign.values()), foreign
    assert seen["threads"] == [["MainThread", False], ["medic-hook", True]]

    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=10) == 0
    assert proc.stderr.read() == ""
    assert os.listdir(sock_dir) == []  # the socket is removed at exit, no staging left behind


def test_without_the_variable_the_pth_line_imports_nothing_of_ours(
    venv: tuple[Path, Path], app: Path
) -> None:
    python, _ = venv
    code = f"import sys; print(sorted(n for n in sys.modules if n.split('.')[0] in {OURS!r} or n.startswith('medic')))"
    done = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, env=target_env(app), cwd=app, timeout=30
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.strip() == "[]"


def test_a_missing_hook_module_never_disturbs_the_targets_start(
    venv: tuple[Path, Path], tmp_path: Path
) -> None:
    """medic uninstalled but its .pth left behind: the target starts silently, without a hook."""
    _, site = venv
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    python = bare / "bin" / "python"
    bare_site = next((bare / "lib").glob("python*/site-packages"))
    shutil.copy2(site / "medic-hook.pth", bare_site / "medic-hook.pth")
    done = subprocess.run(
        [str(python), "-c", "print('started')"],
        capture_output=True,
        text=True,
        env=target_env(tmp_path, MEDIC_HOOK_SOCKET=f"{tmp_path}/x.%p.sock"),
        cwd=tmp_path,
        timeout=30,
    )
    assert done.returncode == 0 and done.stdout.strip() == "started"
    assert done.stderr == ""  # no "Error processing line 1 of medic-hook.pth"


def test_importing_the_hook_starts_and_registers_nothing() -> None:
    code = (
        "import atexit, os, sys, threading\n"
        "before = atexit._ncallbacks()\n"
        "import medic_hook\n"
        "assert atexit._ncallbacks() == before, 'atexit'\n"
        "assert threading.active_count() == 1, 'threads'\n"
        "assert medic_hook.running_path() is None\n"
        f"assert not [n for n in sys.modules if n.split('.')[0] in {OURS!r}], 'our packages'\n"
        "print('clean')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIC_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(REPO)},
        timeout=30,
    )
    assert done.stdout.strip() == "clean", done.stderr


def test_the_distribution_ships_the_hook_as_a_top_level_package() -> None:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "medic_hook*" in config["packages"]["find"]["include"]
    assert "COPY medic_hook/ medic_hook/" in (REPO / "Dockerfile").read_text()
