"""The in-process hook delivered to a Python target of another virtualenv, as to a container of
another image: `medic hook install DIR --python` copies it, the target finds it only through
`PYTHONPATH`, the agent reads its type histogram, and `medic doctor` names what is missing when a
piece is left out. The target's virtualenv has no medic and its own sitecustomize, which still runs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agent.cli.hook import install_python_hook
from agent.core.errors import UsageError
from native_hooks.delivery import interpreter_flags
from support.histo import clean_env, read_ready
from support.procs import REPO, wait_until

TARGET = """
import os, sys, time
class Shipment:
    pass
kept = [Shipment() for _ in range(5000)]
print("ready", os.getpid(), os.environ.get("BARE_SITECUSTOMIZE", "-"), "medic_hook" in sys.modules, flush=True)
time.sleep(120)
"""


def bare_env(**extra: str) -> dict[str, str]:
    """The environment of a target that owes medic nothing: no hook variables, no PYTHONPATH."""
    env = {k: v for k, v in clean_env().items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh virtualenv without medic or pip, whose own sitecustomize leaves a mark."""
    home = tmp_path_factory.mktemp("bare")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(home / "venv")], check=True, timeout=120
    )
    python = str(home / "venv" / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env=bare_env(),
        cwd=home,
    ).stdout.strip()
    Path(site, "sitecustomize.py").write_text("import os\nos.environ['BARE_SITECUSTOMIZE'] = 'ran'\n")
    done = subprocess.run([python, "-c", "import medic_hook"], capture_output=True, env=bare_env(), cwd=home)
    assert done.returncode != 0, "the target's virtualenv must not have medic"
    return python


@pytest.fixture
def sockets() -> str:
    """A short socket directory (a Unix socket path holds 107 bytes), removed by the hook's own rules."""
    return tempfile.mkdtemp(prefix="mh-", dir="/tmp")


def start(spawn, python: str, tmp_path: Path, *flags: str, **env: str) -> tuple[subprocess.Popen, list[str]]:
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    proc = spawn(
        [python, *flags, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=bare_env(**env), cwd=tmp_path,
    )  # fmt: skip
    return proc, read_ready(proc)


def medic(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli.main", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


# ------------------------------------------------------------------------------------- the install
def test_the_install_is_the_package_and_its_autostart_readable_by_all_writable_by_none(tmp_path):
    out = tmp_path / "hook"
    path = Path(install_python_hook(str(out)))
    assert path == out / "python" and sorted(os.listdir(out)) == ["python"]  # nothing left staged
    assert sorted(os.listdir(path)) == ["medic_hook", "sitecustomize.py"]
    shipped = {p.name for p in (REPO / "medic_hook").glob("*.py")} - {"sitecustomize.py"}
    assert set(os.listdir(path / "medic_hook")) == shipped
    for item in [path, path / "medic_hook", *path.rglob("*")]:
        mode = stat.S_IMODE(item.lstat().st_mode)
        assert mode == (0o755 if item.is_dir() else 0o644), (item, oct(mode))

    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (out / "python").rename(tmp_path / "old")
    (out / "python").symlink_to(decoy)  # planted: moved aside, never written through
    install_python_hook(str(out))
    assert os.listdir(decoy) == [] and not (out / "python").is_symlink()
    assert sorted(os.listdir(out)) == ["python"]

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(
        UsageError,
        match=r"cannot install the Python hook into .*: Not a directory; give a writable directory",
    ):
        install_python_hook(str(blocker / "sub"))


@pytest.mark.parametrize(
    ("argv", "flags"),
    [
        (["python3", "-I", "app.py", "-E"], {"I"}),
        (["python3", "-sE", "-X", "dev", "-Wignore", "-u", "app.py"], {"s", "E", "u"}),
        (["python3", "-c", "import x", "-I"], set()),
        (["python3", "-Sm", "pkg"], {"S"}),
        (["python3", "--check-hash-based-pycs", "never", "-I", "app.py"], {"I"}),
    ],
)
def test_interpreter_flags(argv, flags):
    assert interpreter_flags(argv) == flags


# ------------------------------------------------------------------------------------- real targets
@pytest.mark.slow
def test_a_python_of_another_virtualenv_answers_through_pythonpath(
    agent, spawn, tmp_path, bare_python, sockets
):
    done = medic("hook", "install", str(tmp_path / "hook"), "--python", "--json")
    assert done.returncode == 0, done.stderr
    pythonpath = json.loads(done.stdout)["pythonpath"]
    template = f"{sockets}/hook.%p.sock"
    _, words = start(spawn, bare_python, tmp_path, PYTHONPATH=pythonpath, MEDIC_HOOK_SOCKET=template)
    pid = int(words[1])
    assert words[2:] == ["ran", "True"], "its own sitecustomize ran, and medic_hook was loaded"
    agent.start(
        {
            "agent": {"interval": "0.5s", "slow_interval": "1s", "flush_interval": "0.3s"},
            "instances": [
                {
                    "name": "bare",
                    "match": {"pid": pid},
                    "hook": {"socket": template},
                    "histograms": {"python": {"interval": "1s"}},
                }
            ],
        }
    )

    def histogram() -> dict | None:
        latest = agent.get("/api/v1/instances/bare/histograms", kind="type", top=10)["latest"]
        return latest.get("type") if latest else None

    found = wait_until(histogram, timeout=60, interval=0.5)
    assert found["source"] == "python" and found["pid"] == pid
    assert "__main__.Shipment" in {row["name"] for row in found["rows"]}
    report = json.loads(agent.cli("doctor", "bare", "--json").stdout)
    assert report["hook"]["reachable"] and report["hook"]["kind"] == "python" and report["missing"] == []


@pytest.mark.slow
def test_doctor_names_pythonpath_when_it_is_missing(agent, spawn, tmp_path, bare_python, sockets):
    install_python_hook(str(tmp_path / "hook"))
    template = f"{sockets}/hook.%p.sock"
    _, words = start(spawn, bare_python, tmp_path, MEDIC_HOOK_SOCKET=template)
    assert words[2:] == ["ran", "False"]
    agent.start(
        {"instances": [{"name": "bare", "match": {"pid": int(words[1])}, "hook": {"socket": template}}]}
    )
    done = agent.cli("doctor", "bare")
    assert done.returncode == 0, done.stderr
    assert "missing:\n  - PYTHONPATH is not set" in done.stdout
    assert "`medic hook install DIR --python`" in done.stdout and "PYTHONPATH=DIR/python" in done.stdout


def gaps_of(pid: int, socket: str) -> list[str]:
    done = medic("doctor", "--pid", str(pid), "--socket", socket, "--json", "--timeout", "1")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert not report["hook"]["reachable"]
    return report["missing"]


@pytest.mark.slow
def test_doctor_says_exactly_which_piece_is_missing(spawn, tmp_path, bare_python, sockets):
    hooked = install_python_hook(str(tmp_path / "hook"))
    template = f"{sockets}/hook.%p.sock"
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("")
    cases = [
        ((), {"PYTHONPATH": hooked}, "MEDIC_HOOK_SOCKET is not in its environment"),
        (
            (),
            {"PYTHONPATH": str(other), "MEDIC_HOOK_SOCKET": template},
            "names no directory holding medic's hook",
        ),
        (
            (),
            {"PYTHONPATH": f"{other}:{hooked}", "MEDIC_HOOK_SOCKET": template},
            f"{other} comes first on PYTHONPATH with its own sitecustomize.py, which hides medic's in {hooked}",
        ),
        (("-I",), {"PYTHONPATH": hooked, "MEDIC_HOOK_SOCKET": template}, "it runs with -I (isolated mode)"),
        (
            (),
            {"PYTHONPATH": hooked, "MEDIC_HOOK_SOCKET": f"{sockets}/elsewhere.%p.sock"},
            "(its MEDIC_HOOK_SOCKET) but medic looks for",
        ),
    ]
    for flags, env, gap in cases:
        proc, words = start(spawn, bare_python, tmp_path, *flags, **env)
        pid = int(words[1])
        missing = gaps_of(pid, template.replace("%p", str(pid)))
        assert any(gap in item for item in missing), (env, missing)
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_hook_directory_others_can_write_to_is_refused(spawn, tmp_path, bare_python, sockets):
    """The autostart loads no code that a less privileged user could have changed."""
    hooked = install_python_hook(str(tmp_path / "hook"))
    os.chmod(Path(hooked) / "medic_hook", 0o777)
    template = f"{sockets}/hook.%p.sock"
    proc, words = start(
        spawn, bare_python, tmp_path, PYTHONPATH=hooked, MEDIC_HOOK_SOCKET=template, MEDIC_HOOK_DEBUG="1"
    )
    assert words[2:] == ["ran", "False"], "refused, and the target's own sitecustomize still ran"
    proc.kill()
    _, stderr = proc.communicate(timeout=10)
    assert "medic hook: not started: not loaded from" in stderr and "writable by group or others" in stderr
    assert not os.listdir(sockets)
