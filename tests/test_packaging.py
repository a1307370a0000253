"""Packaging: the Dockerfile and its build context, the Kubernetes manifests, the systemd unit, and
`medic hook install`. No Docker daemon here, so the image is checked by parsing the Dockerfile and by
running its builder step (pip install of exactly the files it copies) into a real virtualenv."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent.cli.hook import INSTALLED_SHIM, PYTHON_DIR, find_library, install_hook
from agent.config.loader import load_config, parse_config
from agent.core.errors import UsageError
from agent.core.units import parse_size
from support.procs import REPO, wait_until

MANIFEST = REPO / "deploy/kubernetes/sidecar.yaml"
MANIFESTS = [MANIFEST, REPO / "deploy/kubernetes/sidecar-python.yaml"]  # a native server, a Python one
UNIT = REPO / "deploy/systemd/medic@.service"


# ----------------------------------------------------------------------------- Dockerfile parsing
def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        keyword, _, rest = (pending + line).strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    return out


def stages(instructions: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for keyword, args in instructions:
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, args))
    return result


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories wins."""
    excluded = False
    parts = path.split("/")
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        regex = re.escape(pattern.strip("/")).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, "/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            excluded = not negate
    return excluded


def read_dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def tracked_files(under: str) -> list[str]:
    """The files of the work tree under `under` (tracked or new, not git-ignored): what Docker's build
    context holds, before .dockerignore."""
    done = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", under],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if (REPO / line).is_file()]


def copy_sources() -> list[tuple[str, str]]:
    """(source, destination) of every COPY from the build context (not `--from` another stage)."""
    pairs = []
    for keyword, args in dockerfile_instructions((REPO / "Dockerfile").read_text()):
        if keyword != "COPY" or args.startswith("--from"):
            continue
        words = args.split()
        pairs += [(source, words[-1]) for source in words[:-1]]
    return pairs


@pytest.fixture(scope="module")
def docker() -> list[list[tuple[str, str]]]:
    return stages(dockerfile_instructions((REPO / "Dockerfile").read_text()))


def test_the_dockerignore_matcher_follows_dockers_rules() -> None:
    patterns = ["**/*.so", "docs", "build", "!build/keep.txt"]
    assert dockerignore_excludes(patterns, "native_hooks/libmedic_shim.so")
    assert dockerignore_excludes(patterns, "libx.so")
    assert dockerignore_excludes(patterns, "docs/deploy.md")
    assert not dockerignore_excludes(patterns, "native_hooks/shim.c")
    assert not dockerignore_excludes(patterns, "build/keep.txt")
    assert not dockerignore_excludes(patterns, "docsx/a.md")


def test_every_copy_source_exists_and_is_in_the_build_context() -> None:
    patterns = read_dockerignore()
    pairs = copy_sources()
    assert {"agent/", "native_hooks/", "setup.py", "deploy/container/medic.yaml"} <= {s for s, _ in pairs}
    for source, _ in pairs:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
        files = tracked_files(source) if (REPO / source).is_dir() else [source]
        assert files, f"COPY {source}: no tracked files"
        kept = [f for f in files if not dockerignore_excludes(patterns, f)]
        assert kept, f"COPY {source}: everything is excluded by .dockerignore"
        if (REPO / source).is_dir():
            dropped = [f for f in files if f not in kept]
            assert not dropped, f".dockerignore drops tracked files the image needs: {dropped}"
    assert dockerignore_excludes(patterns, "native_hooks/libmedic_shim.cpython-311-x86_64-linux-gnu.so")


def test_two_stages_on_debian_12_python_and_no_compiler_in_the_image(docker) -> None:
    builder, final = docker
    base = re.search(r"ARG PYTHON_IMAGE=(\S+)", (REPO / "Dockerfile").read_text())
    assert base and base.group(1) == "python:3.11-slim-bookworm"
    assert builder[0] == ("FROM", "${PYTHON_IMAGE} AS builder") and final[0] == ("FROM", "${PYTHON_IMAGE}")
    builder_runs = " ".join(a for k, a in builder if k == "RUN")
    final_runs = " ".join(a for k, a in final if k == "RUN")
    assert "gcc" in builder_runs and "gcc" not in final_runs
    assert "medic hook path" in builder_runs  # the build fails when the shim was not compiled
    assert "libjemalloc2" in final_runs
    assert re.search(r"apt-get install [^&]*\btini\b", final_runs), "tini is the final image's init"


def test_medic_is_not_pid_1_of_the_image_an_init_reaps_orphans(docker) -> None:
    """Without an init, medic would be PID 1: orphans would pile up as zombies and the kernel would drop
    the signals it has no handler for; tini (Debian's package, /usr/bin/tini) runs medic as its child,
    and `-s` keeps reaping where a pod's pause container is PID 1 (shareProcessNamespace)."""
    final = dict(docker[1])
    assert json.loads(final["ENTRYPOINT"]) == ["/usr/bin/tini", "-s", "--", "medic"]


def test_the_image_runs_medic_as_a_non_root_user_in_exec_form(docker) -> None:
    final = dict(docker[1])
    user = final["USER"].split(":")
    assert user[0].isdigit() and int(user[0]) != 0, "the user must be numeric (runAsNonRoot) and not root"
    assert f"--uid {user[0]}" in final["RUN"]
    assert json.loads(final["ENTRYPOINT"])[-1] == "medic"
    assert json.loads(final["CMD"]) == ["run", "--config", "/etc/medic/medic.yaml"]
    options, _, command = final["HEALTHCHECK"].partition("CMD ")
    probe = json.loads(command)
    assert isinstance(probe, list) and "/healthz" in " ".join(probe)
    assert "--timeout=" in options
    volumes = json.loads(final["VOLUME"])
    default = load_config(REPO / "deploy/container/medic.yaml")
    assert str(default.agent.state_dir) in volumes
    assert f"MEDIC_URL=http://127.0.0.1:{default.agent.port}" in final["ENV"]
    assert final["EXPOSE"] == str(default.agent.port)


# ----------------------------------------------------------------------------- Kubernetes manifests
@pytest.fixture(scope="module", params=MANIFESTS, ids=lambda path: path.name)
def manifests(request: pytest.FixtureRequest) -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all(request.param.read_text()) if d]
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(set(kinds)), kinds
    return {d["kind"]: d for d in docs}


def _pod(manifests: dict[str, dict]) -> dict:
    return manifests["Deployment"]["spec"]["template"]["spec"]


def _containers(pod: dict) -> dict[str, dict]:
    return {c["name"]: c for c in pod.get("initContainers", []) + pod["containers"]}


def _downward_env(manifests: dict[str, dict]) -> dict[str, str]:
    """The medic container's environment as the kubelet fills it from the Downward API
    (`resourceFieldRef` limits in bytes) and plain values; secrets are left out."""
    containers = _containers(_pod(manifests))
    env: dict[str, str] = {}
    for item in containers["medic"].get("env", []):
        ref = item.get("valueFrom", {}).get("resourceFieldRef")
        if ref:
            section, resource = ref["resource"].split(".")
            quantity = containers[ref.get("containerName", "medic")]["resources"][section][resource]
            env[item["name"]] = str(parse_size(quantity))
        elif "value" in item:
            env[item["name"]] = item["value"]
    return env


def _medic_config(manifests: dict[str, dict]):
    return parse_config(
        manifests["ConfigMap"]["data"]["medic.yaml"], source="ConfigMap", environ=_downward_env(manifests)
    )


def test_the_configmap_config_passes_medic_config_check(manifests, tmp_path: Path) -> None:
    path = tmp_path / "medic.yaml"
    path.write_text(manifests["ConfigMap"]["data"]["medic.yaml"])
    env = {**os.environ, **_downward_env(manifests)}
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "config", "check", "--json", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    effective = json.loads(done.stdout)
    assert effective["remediation"]["coordinator"]["backend"] in ("etcd", "local")
    bad = tmp_path / "bad.yaml"  # the same check does fail: the kubernetes backend is refused
    bad.write_text(path.read_text().replace("backend: etcd", "backend: kubernetes"))
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "config", "check", str(bad)],
        cwd=REPO,
        capture_output=True,
        env=env,
    )
    assert done.returncode == 2 and b"not implemented" in done.stderr
    unset = {k: v for k, v in env.items() if k != "SERVER_MEMORY_LIMIT"}  # outside the pod: one clear line
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "config", "check", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=unset,
    )
    assert done.returncode == 2 and "environment variable SERVER_MEMORY_LIMIT is not set" in done.stderr


def test_every_container_has_resources_probes_and_a_restricted_security_context(manifests) -> None:
    pod = _pod(manifests)
    assert pod["shareProcessNamespace"] is True
    for name, container in _containers(pod).items():
        resources = container.get("resources", {})
        assert resources.get("requests", {}).get("memory"), f"{name}: no memory request"
        assert resources.get("limits", {}).get("memory"), f"{name}: no memory limit"
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]
        assert not security["capabilities"].get("add"), f"{name}: same uid as the target needs no capability"
    for container in pod["containers"]:
        ports = {p["name"] for p in container.get("ports", [])}
        for probe in ("readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            assert get["port"] in ports, f"{container['name']}.{probe}: port {get['port']} not declared"
    medic = _containers(pod)["medic"]
    assert medic["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_volumes_env_and_secrets_referenced_exist(manifests) -> None:
    pod = _pod(manifests)
    volumes = {v["name"]: v for v in pod["volumes"]}
    secret = manifests["Secret"]
    for name, container in _containers(pod).items():
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{name}: volume {mount['name']} is not declared"
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    assert volumes["medic-config"]["configMap"]["name"] == manifests["ConfigMap"]["metadata"]["name"]
    config = _medic_config(manifests)
    medic_env = {e["name"] for e in _containers(pod)["medic"].get("env", [])}
    for sink in config.notify.sinks:
        for key in ("secret_env", "url_env"):
            if getattr(sink, key, None):
                assert getattr(sink, key) in medic_env, f"{sink.type}.{key} is not set in the medic container"
    if config.notify.receiver.secret_env:
        assert config.notify.receiver.secret_env in medic_env


def test_the_config_matches_the_server_container(manifests) -> None:
    pod = _pod(manifests)
    containers = _containers(pod)
    server, medic = containers["server"], containers["medic"]
    config = _medic_config(manifests)
    (instance,) = config.instances
    assert re.search(instance.match.cmdline, " ".join(server["args"])), "the cmdline regex misses the server"
    assert instance.memory_limit == parse_size(server["resources"]["limits"]["memory"])
    assert "memory_limit: ${SERVER_MEMORY_LIMIT}" in manifests["ConfigMap"]["data"]["medic.yaml"]
    downward = {e["name"]: e for e in medic["env"]}["SERVER_MEMORY_LIMIT"]["valueFrom"]
    assert downward == {"resourceFieldRef": {"containerName": "server", "resource": "limits.memory"}}
    server_env = {e["name"]: e.get("value") for e in server["env"]}
    assert server_env["MEDIC_HOOK_SOCKET"] == instance.hook.socket
    socket_dir = os.path.dirname(instance.hook.socket)
    for container in (server, medic):
        assert any(
            m["mountPath"] == socket_dir and m["name"] == "medic-run" for m in container["volumeMounts"]
        )
    installer = containers["medic-hook-install"]
    hook_dir = installer["args"][2]
    preload = server_env["LD_PRELOAD"].split(":")
    if "PYTHONPATH" in server_env:  # the in-process hook, from the copy `--python` makes; no shim beside it
        assert "--python" in installer["args"] and server_env["PYTHONPATH"] == f"{hook_dir}/{PYTHON_DIR}"
        assert preload == [f"{hook_dir}/libjemalloc.so.2"]
    else:
        assert preload == [f"{hook_dir}/libjemalloc.so.2", f"{hook_dir}/{INSTALLED_SHIM}"]
    assert {"name": "medic-hook", "mountPath": hook_dir, "readOnly": True} in server["volumeMounts"]
    server_port = {p["containerPort"] for p in server["ports"]}
    assert int(re.search(r":(\d+)/", instance.latency.prometheus.url).group(1)) in server_port
    token = containers["medic-admin-token"]["command"][-1]
    assert token == f"{config.agent.state_dir}/admin.token"


def test_ports_images_and_user_are_consistent(manifests, docker) -> None:
    pod = _pod(manifests)
    containers = _containers(pod)
    config = _medic_config(manifests)
    medic_port = {p["name"]: p["containerPort"] for p in containers["medic"]["ports"]}["metrics"]
    assert medic_port == config.agent.port
    annotations = manifests["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == str(
        medic_port
    )
    # one scrape path: the pods carry the annotations, the Service none (an endpoints job would scrape twice)
    assert not any(
        key.startswith("prometheus.io/") for key in manifests["Service"]["metadata"].get("annotations", {})
    )
    assert manifests["Service"]["spec"]["ports"][0]["targetPort"] == "metrics"
    version = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    medic_images = {c["image"] for n, c in containers.items() if n.startswith("medic")}
    assert medic_images == {f"sidecar-medic:{version}"}
    image_user = dict(docker[1])["USER"].split(":")[0]
    assert str(pod["securityContext"]["runAsUser"]) == image_user and pod["securityContext"]["runAsNonRoot"]


# ----------------------------------------------------------------------------- medic hook install
def test_hook_install_copies_the_shim_and_allocator_readable_by_others(tmp_path: Path) -> None:
    out = tmp_path / "hook"
    installed = install_hook(str(out), "jemalloc")
    assert installed["preload"] == [str(out / "libjemalloc.so.2"), str(out / INSTALLED_SHIM)]
    for path in installed["preload"]:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o755
    assert sorted(os.listdir(out)) == ["libjemalloc.so.2", INSTALLED_SHIM]  # no staging files left
    again = install_hook(str(out), "glibc")  # replaces in place
    assert again["preload"] == [str(out / INSTALLED_SHIM)]


def test_hook_install_errors_say_what_to_do(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match="writable directory"):
        install_hook(str(blocker / "sub"))
    with pytest.raises(UsageError, match="apt-get install"):
        find_library("libnot-a-real-allocator.so.9")
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "hook", "install", str(blocker)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "medic: error: cannot install the hook" in done.stderr


@pytest.mark.native
def test_a_target_loads_the_installed_copy_and_answers(tmp_path: Path, spawn) -> None:
    """The copy works on its own: the target preloads it from the install directory and serves its hook."""
    from native_hooks.client import HookClient

    installed = install_hook(str(tmp_path / "hook"), "jemalloc")
    sockets = tmp_path / "run"
    env = {
        **os.environ,
        "LD_PRELOAD": ":".join(installed["preload"]),
        "MEDIC_HOOK_SOCKET": f"{sockets}/hook.%p.sock",
    }
    target = spawn([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    path = sockets / f"hook.{target.pid}.sock"
    wait_until(path.exists, timeout=10)
    with HookClient(str(path), 5.0) as client:
        reply = client.request("stats")
    assert reply["ok"] and reply["allocator"] == "jemalloc"
    maps = Path(f"/proc/{target.pid}/maps").read_text()
    assert str(tmp_path / "hook" / INSTALLED_SHIM) in maps


# ----------------------------------------------------------------------------- the image's builder step
@pytest.fixture(scope="module")
def installed_medic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`pip install` of exactly the files the Dockerfile copies (minus .dockerignore) into a virtualenv:
    the builder stage, without Docker. Its dependencies come from this interpreter (system site)."""
    root = tmp_path_factory.mktemp("image")
    context = root / "src"
    patterns = read_dockerignore()
    for source, _ in copy_sources():
        if source.startswith("deploy/"):
            continue  # copied into the final stage, not part of the Python package
        files = tracked_files(source) if (REPO / source).is_dir() else [source]
        for name in files:
            if not dockerignore_excludes(patterns, name):
                (context / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, context / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    done = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", "--no-deps", str(context)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    yield venv / "bin/medic"


@pytest.mark.slow
@pytest.mark.native
def test_the_builder_step_compiles_the_shim_into_the_package(installed_medic: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(installed_medic), "hook", "path"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    shim = Path(done.stdout.strip())
    assert shim.is_file() and str(installed_medic.parent.parent) in str(shim)
    done = subprocess.run(
        [str(installed_medic), "config", "check", "-q", str(REPO / "deploy/container/medic.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr


CLASSIFIERS = {
    "Environment :: No Input/Output (Daemon)",
    "Intended Audience :: System Administrators",
    "Operating System :: POSIX :: Linux",
    "Programming Language :: Python :: 3.11",
    "Programming Language :: Python :: 3.12",
    "Topic :: System :: Monitoring",
}


def test_the_license_file_is_the_apache_2_text_the_metadata_declares() -> None:
    import tomllib  # Python 3.11+, as the tests are

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply" in text
    assert ("LICENSE", "./") in copy_sources()  # the image's install carries it too


@pytest.mark.slow
@pytest.mark.native
def test_the_built_metadata_carries_the_license_and_classifiers(
    installed_medic: Path, tmp_path: Path
) -> None:
    code = (
        "import importlib.metadata as m, json; d = m.distribution('sidecar-medic'); "
        "print(json.dumps({'meta': d.metadata.json, 'files': [str(f) for f in d.files]}))"
    )
    python = installed_medic.parent / "python"
    done = subprocess.run(  # not in the repository: its own egg-info would answer
        [str(python), "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    built = json.loads(done.stdout)
    assert built["meta"]["license_expression"] == "Apache-2.0"
    assert set(built["meta"]["classifier"]) >= CLASSIFIERS
    assert any(c.startswith("Development Status :: ") for c in built["meta"]["classifier"])
    assert any(f.endswith("licenses/LICENSE") for f in built["files"]), built["files"]


# ----------------------------------------------------------------------------- systemd
def _verify(unit_text: str, directory: Path) -> subprocess.CompletedProcess:
    directory.mkdir()
    unit = directory / "medic@ranker.service"
    unit.write_text(unit_text)
    return subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)


def _unit_settings(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def test_the_unit_is_consistent_with_the_agent() -> None:
    settings = _unit_settings(UNIT.read_text())
    assert settings["StateDirectoryMode"] == "0700" and settings["NoNewPrivileges"] == "yes"
    assert settings["ProtectSystem"] == "strict" and settings["Restart"] == "on-failure"
    assert "medic/%i" in settings["StateDirectory"].split()
    assert "--state-dir /var/lib/medic/%i" in settings["ExecStart"]
    # the agent's own stop: managed children's stop_timeout (5 s default) + uvicorn's 2 s + flush
    assert int(settings["TimeoutStopSec"].rstrip("s")) >= 15
    # an fd budget: the API's connection cap sits well below it (docs/deploy.md, "Threat model")
    assert 1024 <= int(settings["LimitNOFILE"]) <= 65536
    assert set(settings["CapabilityBoundingSet"].split()) == {
        "CAP_SYS_PTRACE",
        "CAP_KILL",
        "CAP_DAC_OVERRIDE",
        "CAP_DAC_READ_SEARCH",
    }


@pytest.mark.slow
@pytest.mark.native
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit_with_a_real_medic(installed_medic: Path, tmp_path: Path) -> None:
    text = UNIT.read_text().replace("/opt/medic/bin/medic", str(installed_medic))
    done = _verify(text, tmp_path / "good")
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    broken = text.replace("NoNewPrivileges=yes", "NoNewPrivilegez=yes")  # the check can fail
    done = _verify(broken, tmp_path / "bad")
    assert "Unknown key" in done.stderr


# ----------------------------------------------------------------------------- native parts and dependencies
def _build_context(root: Path) -> Path:
    """The files of the Python package, as the image's builder gets them."""
    context = root / "src"
    patterns = read_dockerignore()
    for source, _ in copy_sources():
        if source.startswith("deploy/"):
            continue
        files = tracked_files(source) if (REPO / source).is_dir() else [source]
        for name in files:
            if not dockerignore_excludes(patterns, name):
                (context / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, context / name)
    return context


@pytest.mark.slow
def test_an_install_without_a_compiler_succeeds_with_the_python_fallback(tmp_path: Path) -> None:
    """CC=false: both native parts fail to compile; the install goes on, says so, and medic runs on
    the Python twins of the trend kernels."""
    context = _build_context(tmp_path)
    wheels = tmp_path / "wheels"
    env = {**os.environ, "CC": "false", "PIP_CONSTRAINT": str(REPO / "constraints.txt")}
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(wheels), str(context)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "agent.detect._kernels was not built" in built.stdout + built.stderr
    assert "medic uses the Python fallback" in built.stdout + built.stderr
    (wheel,) = wheels.glob("*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([str(venv / "bin/pip"), "install", "-q", "--no-deps", str(wheel)], check=True, timeout=120)
    probe = (
        "import agent.detect.trend as t, json; "
        "print(json.dumps({'kernels': t._kernels is not None, 'file': t.__file__}))"
    )
    done = subprocess.run(
        [str(venv / "bin/python"), "-c", probe], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    state = json.loads(done.stdout)
    assert state["kernels"] is False and str(venv) in state["file"]
    hook = subprocess.run(
        [str(venv / "bin/medic"), "hook", "path"], capture_output=True, text=True, cwd=tmp_path
    )
    assert hook.returncode != 0 and "the LD_PRELOAD shim is not built" in hook.stderr
    assert "Traceback" not in hook.stderr


# the kernels' twin check, run by each interpreter on the wheel's files alone (no dependency, no medic
# package: trend.py is loaded as a lone module, its own `_kernels` import fails and it is pure Python)
TWIN_CHECK = """
import importlib.util, json, random, sys
root = sys.argv[1]
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
sys.modules["agent"] = None  # no medic package of this interpreter's own either
trend = load("lone_trend", root + "/agent/detect/trend.py")
kernels = load("agent.detect._kernels", root + "/agent/detect/_kernels.abi3.so")
rng = random.Random(7)
agree = trend._kernels is None
for n in (3, 4, 17, 60):
    xs = [1.7e9 + 60.0 * i + rng.random() for i in range(n)]
    ys = [rng.uniform(-1e9, 1e9) if rng.random() < 0.8 else rng.choice([0.0, 1.0]) for _ in range(n)]
    agree &= kernels.slope_median(xs, ys) == trend._median_sorted(trend._pair_slopes(xs, ys))
    agree &= kernels.mk_score(ys) == trend.mk_score(ys)
print(json.dumps({"version": list(sys.version_info[:2]), "agree": agree, "file": kernels.__file__}))
"""


def _cpythons_from(floor: tuple[int, int]) -> dict[tuple[int, int], str]:
    """One CPython per version from `floor` on, among this one, `python3.X` on PATH and pyenv's
    versions (the development machines carry several); free-threaded builds have no stable ABI."""
    candidates = [sys.executable]
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in range(floor[1], 20)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += [str(p) for p in sorted(pyenv.glob("versions/3.*/bin/python3"))]
    probe = (
        "import sys, sysconfig; print(sys.implementation.name, *sys.version_info[:2], "
        "bool(sysconfig.get_config_var('Py_GIL_DISABLED')))"
    )
    found: dict[tuple[int, int], str] = {}
    for candidate in filter(None, candidates):
        try:
            done = subprocess.run([candidate, "-c", probe], capture_output=True, text=True, timeout=20)
        except OSError:
            continue
        words = done.stdout.split()
        if done.returncode or len(words) != 4 or words[0] != "cpython" or words[3] == "True":
            continue
        version = (int(words[1]), int(words[2]))
        if version >= floor:
            found.setdefault(version, candidate)
    return found


@pytest.mark.slow
@pytest.mark.native
def test_one_abi3_wheel_serves_every_supported_python(tmp_path: Path) -> None:
    """The kernels are built against the limited API of requires-python's floor: the wheel is tagged
    `cp310-abi3-<platform>`, holds `_kernels.abi3.so` and the plain shim, and the very same
    extension loads in every CPython on the machine from that floor on and agrees with its twin."""
    import sysconfig
    import zipfile

    import tomllib
    from packaging.specifiers import SpecifierSet

    floor = (3, 10)
    requires = SpecifierSet(
        tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    )
    assert "3.10" in requires and "3.9" not in requires, "setup.py's OLDEST_PYTHON follows requires-python"
    wheels, context = tmp_path / "wheels", _build_context(tmp_path)
    built = subprocess.run(  # the venv's setuptools (constraints.txt's): no isolated build env to fetch
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "was not built" not in built.stderr, built.stderr
    (wheel,) = wheels.glob("*.whl")
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel.name == f"sidecar_medic-0.1.0-cp310-abi3-{platform}.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/WHEEL")]
        assert f"Tag: cp310-abi3-{platform}" in archive.read(metadata).decode().splitlines()
        archive.extractall(tmp_path / "unpacked")
    native = sorted(n for n in names if n.endswith(".so"))
    assert native == ["agent/detect/_kernels.abi3.so", "native_hooks/libmedic_shim.so"], native
    interpreters = _cpythons_from(floor)
    assert sys.version_info[:2] in interpreters
    results = {}
    for version, python in interpreters.items():
        done = subprocess.run(
            [python, "-I", "-c", TWIN_CHECK, str(tmp_path / "unpacked")],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=60,
        )
        assert done.returncode == 0, f"Python {version}: {done.stderr[-2000:]}"
        results[version] = json.loads(done.stdout)
    for version, result in results.items():
        assert result["agree"] is True, f"Python {version}: the C kernels and the Python twins differ"
        assert result["version"] == list(version) and str(tmp_path / "unpacked") in result["file"]


@pytest.mark.slow
@pytest.mark.native
def test_the_shim_is_a_plain_c_library_not_a_python_extension(installed_medic: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(installed_medic), "hook", "path"], capture_output=True, text=True, cwd=tmp_path
    )
    shim = Path(done.stdout.strip())
    assert shim.name == "libmedic_shim.so", "no interpreter suffix: one file serves every Python version"
    needed = subprocess.run(["readelf", "-d", str(shim)], capture_output=True, text=True, check=True).stdout
    assert "libpython" not in needed
    symbols = subprocess.run(
        ["nm", "-D", str(shim)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "medic_shim_socket_path" in symbols
    assert not [s for s in symbols if s.startswith(("Py", "_Py", "PyInit"))], "the shim uses no Python API"


def _requirements() -> tuple[dict, dict[str, str]]:
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    parsed = {
        extra: [Requirement(r) for r in reqs]
        for extra, reqs in [("", project["dependencies"]), *project["optional-dependencies"].items()]
    }
    return parsed, pins


def test_lint_tools_have_their_own_extra_and_the_web_stack_upper_bounds() -> None:
    extras, _ = _requirements()
    names = {extra: {r.name.lower() for r in reqs} for extra, reqs in extras.items()}
    assert {"ruff", "mypy", "types-pyyaml"} <= names["lint"]
    assert not names["test"] & names["lint"], "the test extra holds no lint tool"
    bounded = {r.name.lower(): r.specifier for r in extras[""]}
    for name in ("fastapi", "starlette", "uvicorn", "pydantic", "prometheus-client"):
        assert any(spec.operator == "<" for spec in bounded[name]), f"{name} has no upper bound"


def test_the_constraints_pin_every_dependency_within_its_bounds_and_are_used() -> None:
    extras, pins = _requirements()
    for extra, reqs in extras.items():
        for requirement in reqs:
            name = requirement.name.lower().replace("_", "-")
            assert name in pins, f"{name} ({extra or 'runtime'}) is not pinned in constraints.txt"
            assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} outside {requirement}"
    makefile = (REPO / "Makefile").read_text()
    assert "pip install -q -c constraints.txt -e '.[test,lint]'" in makefile
    assert "$(RUN_BIN)/pip install -q -c constraints.txt -e .\n" in makefile
    assert "PIP_CONSTRAINT=/src/constraints.txt" in (REPO / "Dockerfile").read_text()
    assert ("constraints.txt", "./") in copy_sources()


def test_make_run_installs_the_agent_alone_in_a_venv_of_its_own(tmp_path: Path) -> None:
    """`make run` needs medic's runtime dependencies only (about 55 MiB with pip), not the test and
    lint tools of `make test` (about 470 MiB); `make demo` adds only the demo extra to it."""
    done = subprocess.run(
        ["make", "-n", "run", "demo", f"RUN_VENV={tmp_path}/run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    installs = [line for line in done.stdout.splitlines() if "pip install" in line]
    assert installs == [
        f"{tmp_path}/run/bin/pip install -q -c constraints.txt -e .",
        f"{tmp_path}/run/bin/pip install -q -c constraints.txt -e '.[demo]'",
    ], done.stdout
    assert f"{tmp_path}/run/bin/medic run" in done.stdout and f"{tmp_path}/run/bin/medic demo" in done.stdout
