"""The process, smaps and cgroup probes: on fixture trees, on real children, inside real v1 cgroups
created for the test (root), and against a real permission error."""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.core.catalog import CATALOG
from agent.core.errors import ProbeAccessDenied, ProbeError, ProbeUnavailable, TargetGone
from agent.core.records import ProbeResult, ProbeTarget
from probes.cgroup import CgroupProbe
from probes.linux import procfs, procstatus
from probes.linux.cgroupfiles import cgroup_memory_limit
from probes.process import ProcessProbe
from probes.registry import PROBES, create_probe
from probes.smaps import SmapsProbe
from support.procs import REPO, wait_ready, wait_until, workload_argv

FIXTURES = Path(__file__).parent / "fixtures"
PROC_ROOT = FIXTURES / "proc"
MiB = 2**20


def target_of(pid: int, root: Path = procfs.HOST_ROOT, name: str = "t") -> ProbeTarget:
    return ProbeTarget(name, pid, procfs.process_identity(pid, root).start_time)


def values(result: ProbeResult, source: str) -> dict[str, float]:
    """Samples as {metric: value}, checking each is a catalog metric of the probe that made it."""
    found = {}
    for sample in result.samples:
        assert CATALOG[sample.metric].source == source, sample.metric
        found[sample.metric] = sample.value
    assert len(found) == len(result.samples), "a metric was emitted twice"
    return found


def test_registry_entries_build_these_probes():
    for name, schedule in (("process", "fast"), ("smaps", "slow"), ("cgroup", "fast")):
        probe = create_probe(name)
        assert probe.name == name and probe.schedule == schedule
        assert type(probe).__name__ == PROBES[name].cls


# --------------------------------------------------------------------------- fixture trees


def test_process_probe_on_a_captured_process():
    target = target_of(10299, PROC_ROOT)
    found = values(ProcessProbe(PROC_ROOT).collect(target, 100.0), "process")
    assert found == {
        "cpu_seconds_total": 0.0,
        "threads": 1,
        "minor_faults_total": 74,
        "major_faults_total": 0,
        "rss_bytes": 439 * procfs.PAGE_SIZE,
        "vms_bytes": 730 * procfs.PAGE_SIZE,
        "rss_anon_bytes": 108 * 1024,
        "rss_file_bytes": 1648 * 1024,
        "rss_shmem_bytes": 0,
        "rss_peak_bytes": 1756 * 1024,
        "swap_bytes": 0,
        "ctx_switches_voluntary_total": 1,
        "ctx_switches_involuntary_total": 0,
        "open_fds": 3,
    }


def test_process_and_smaps_probes_on_a_captured_zombie_and_kernel_thread():
    with pytest.raises(TargetGone, match="zombie"):
        ProcessProbe(PROC_ROOT).collect(target_of(10300, PROC_ROOT), 0.0)
    with pytest.raises(ProbeUnavailable):
        SmapsProbe(PROC_ROOT).collect(target_of(2, PROC_ROOT), 0.0)
    found = values(SmapsProbe(PROC_ROOT).collect(target_of(10299, PROC_ROOT), 0.0), "smaps")
    assert found == {"pss_bytes": 279 * 1024, "uss_bytes": 144 * 1024, "swap_pss_bytes": 0}


def test_cgroup_probe_on_the_hybrid_v1_capture():
    found = values(CgroupProbe(FIXTURES / "cgroup_v1").collect(ProbeTarget("t", 9740, 0.0), 5.0), "cgroup")
    assert found["cgroup_memory_limit_bytes"] == 300 * MiB
    assert found["cgroup_memory_usage_bytes"] == 49377280
    assert found["cgroup_cpu_quota_cores"] == pytest.approx(0.2)
    assert found["cgroup_cpu_throttled_periods_total"] == 33
    assert found["cgroup_cpu_throttled_seconds_total"] == pytest.approx(2.561798214)
    assert found["cgroup_cpu_pressure_some_seconds_total"] == pytest.approx(2.564239)
    assert set(found) == {spec.name for spec in CATALOG.values() if spec.source == "cgroup"}


def test_cgroup_probe_on_the_v2_tree():
    found = values(CgroupProbe(FIXTURES / "cgroup_v2").collect(ProbeTarget("t", 4321, 0.0), 5.0), "cgroup")
    assert found["cgroup_memory_limit_bytes"] == 512 * MiB
    assert found["cgroup_memory_working_set_bytes"] == 402653184 - 104857600
    assert found["cgroup_oom_kills_total"] == 1 and found["cgroup_memory_limit_hits_total"] == 17
    assert found["cgroup_cpu_quota_cores"] == pytest.approx(0.5)
    assert found["cgroup_cpu_throttled_seconds_total"] == pytest.approx(42.5)
    assert found["cgroup_memory_pressure_full_seconds_total"] == pytest.approx(1.2)
    assert set(found) == {spec.name for spec in CATALOG.values() if spec.source == "cgroup"}


def _v2_tree(root: Path, path: str, files: dict[str, str]) -> Path:
    (root / "proc/self").mkdir(parents=True, exist_ok=True)
    (root / "proc/self/mountinfo").write_text("1 0 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    (root / "proc/7").mkdir(exist_ok=True)
    (root / "proc/7/cgroup").write_text(f"0::{path}\n")
    directory = root / "sys/fs/cgroup" / path.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name).write_text(content)
    return directory


def test_cgroup_probe_leaves_out_what_the_host_lacks(tmp_path):
    _v2_tree(tmp_path, "/svc", {"memory.current": "4096\n"})
    found = values(CgroupProbe(tmp_path).collect(ProbeTarget("t", 7, 1.0), 5.0), "cgroup")
    assert found == {"cgroup_memory_usage_bytes": 4096}


def test_cgroup_probe_raises_when_nothing_could_be_read(tmp_path):
    directory = _v2_tree(tmp_path, "/svc", {})
    (directory / "memory.current").mkdir()
    with pytest.raises(ProbeError, match=r"memory\.current"):
        CgroupProbe(tmp_path).collect(ProbeTarget("t", 7, 1.0), 5.0)


def test_cgroup_probe_caches_the_location_until_forget_or_the_cgroup_vanishes(tmp_path):
    old = _v2_tree(tmp_path, "/old", {"memory.current": "1\n"})
    _v2_tree(tmp_path, "/new", {"memory.current": "2\n"})  # the process now says it is in /new
    probe, target = CgroupProbe(tmp_path), ProbeTarget("t", 7, 1.0)
    assert values(probe.collect(target, 5.0), "cgroup")["cgroup_memory_usage_bytes"] == 2
    (tmp_path / "proc/7/cgroup").write_text("0::/old\n")
    assert values(probe.collect(target, 6.0), "cgroup")["cgroup_memory_usage_bytes"] == 2  # cached
    probe.forget(target)
    assert values(probe.collect(target, 7.0), "cgroup")["cgroup_memory_usage_bytes"] == 1
    (tmp_path / "proc/7/cgroup").write_text("0::/new\n")
    shutil.rmtree(old)  # the cached cgroup is gone: the probe looks again, on the same tick
    assert values(probe.collect(target, 8.0), "cgroup")["cgroup_memory_usage_bytes"] == 2


# --------------------------------------------------------------------------- real processes


def test_rss_of_a_leaking_child_rises_and_of_a_stable_child_stays_flat(workload):
    leak = workload("leak", "--rate", "4Mi", "--every", "0.05s")
    stable = workload("stable", "--size", "16Mi")
    probe = ProcessProbe()
    targets = {"leak": target_of(leak.pid), "stable": target_of(stable.pid)}
    series: dict[str, list[dict[str, float]]] = {"leak": [], "stable": []}
    for _ in range(8):
        for name, target in targets.items():
            result = probe.collect(target, time.time())
            assert result.problems == []
            series[name].append(values(result, "process"))
        time.sleep(0.2)
    leak_rss = [point["rss_bytes"] for point in series["leak"]]
    stable_rss = [point["rss_bytes"] for point in series["stable"]]
    assert leak_rss[-1] - leak_rss[0] >= 4 * MiB, leak_rss  # ~1.4 s at 4 MiB/s
    assert all(b >= a for a, b in itertools.pairwise(leak_rss)), leak_rss
    assert max(stable_rss) - min(stable_rss) < 1 * MiB, stable_rss
    assert stable_rss[0] > 16 * MiB
    last = series["leak"][-1]
    assert last["rss_anon_bytes"] > last["rss_bytes"] / 2 and last["rss_peak_bytes"] >= last["rss_bytes"]
    assert last["cpu_seconds_total"] >= series["leak"][0]["cpu_seconds_total"]
    assert last["open_fds"] >= 3 and last["threads"] >= 1


def test_vanished_zombie_and_reused_pids_are_target_gone(workload):
    proc = workload("stable", "--size", "4Mi")
    probe, target = ProcessProbe(), target_of(proc.pid)
    with pytest.raises(TargetGone, match="belongs to another process"):
        probe.collect(ProbeTarget("t", proc.pid, target.start_time - 10), time.time())
    with pytest.raises(TargetGone, match="belongs to another process"):
        SmapsProbe().collect(ProbeTarget("t", proc.pid, target.start_time - 10), time.time())
    proc.send_signal(signal.SIGKILL)
    wait_until(lambda: procfs.read_stat(proc.pid).state == "Z", 5)  # not reaped yet
    with pytest.raises(TargetGone, match="zombie"):
        probe.collect(target, time.time())
    proc.wait()
    for gone_probe in (ProcessProbe(), SmapsProbe()):
        with pytest.raises(TargetGone, match=f"process {proc.pid} is gone"):
            gone_probe.collect(target, time.time())


def test_smaps_probe_on_a_real_child(workload):
    proc = workload("stable", "--size", "16Mi")
    target = target_of(proc.pid)
    found = values(SmapsProbe().collect(target, time.time()), "smaps")
    rss = values(ProcessProbe().collect(target, time.time()), "process")["rss_bytes"]
    assert 16 * MiB <= found["uss_bytes"] <= found["pss_bytes"] <= rss + MiB


def test_smaps_probe_on_a_kernel_thread_is_unavailable():
    if procfs.read_stat(2).comm != "kthreadd":
        pytest.skip("pid 2 is not kthreadd here (a pid namespace?)")
    with pytest.raises(ProbeUnavailable, match="no memory map"):
        SmapsProbe().collect(target_of(2), time.time())


def test_cgroup_probe_on_this_machine(workload):
    proc = workload("stable", "--size", "4Mi")
    result = CgroupProbe().collect(target_of(proc.pid), time.time())
    assert result.problems == []
    found = values(result, "cgroup")
    assert found.get("cgroup_memory_usage_bytes", 1) > 0


# --------------------------------------------------------------------------- real v1 cgroups (root)


def own_v1_directory(controller: str) -> Path | None:
    """This process's directory in the v1 hierarchy of `controller` (REFERENCE.md §5.2-5.3)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            directory = Path(f"/sys/fs/cgroup/{controllers}") / path.lstrip("/")
            return directory if directory.is_dir() else None
    return None


class ChildCgroups:
    """v1 cgroups created under this process's own, and the children started in them. At teardown the
    children are killed and reaped first, then the cgroups are removed."""

    def __init__(self, spawn) -> None:
        self._spawn = spawn
        self.created: list[Path] = []
        self.children: list[subprocess.Popen] = []

    def create(self, controller: str, settings: dict[str, str]) -> Path:
        if os.geteuid() != 0:
            pytest.skip("creating a cgroup needs root")
        parent = own_v1_directory(controller)
        if parent is None:
            pytest.skip(f"no cgroup v1 {controller} controller is mounted here")
        path = parent / f"medic-test-{os.getpid()}-{len(self.created)}"
        try:
            path.mkdir()
        except OSError as exc:
            pytest.skip(f"cannot create a v1 {controller} cgroup at {path}: {exc.strerror}")
        self.created.append(path)
        for name, value in settings.items():
            (path / name).write_text(value)
        return path

    def start(self, cgroup: Path, argv: list[str], **kwargs) -> subprocess.Popen:
        """Run argv inside `cgroup` from its first instruction: the shell moves itself, then execs."""
        mover = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *argv]
        proc = self._spawn(mover, **kwargs)
        self.children.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        for path in reversed(self.created):
            deadline = time.monotonic() + 5
            while True:
                try:
                    path.rmdir()
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)


@pytest.fixture
def child_cgroups(spawn):
    cgroups = ChildCgroups(spawn)
    yield cgroups
    cgroups.cleanup()


@pytest.mark.root
def test_real_v1_memory_cgroup_limit_and_usage(child_cgroups):
    cgroup = child_cgroups.create("memory", {"memory.limit_in_bytes": str(300 * MiB)})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    leak = child_cgroups.start(
        cgroup,
        workload_argv("leak", "--rate", "8Mi", "--every", "0.05s"),
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    wait_ready(leak)
    assert str(leak.pid) in (cgroup / "cgroup.procs").read_text().split()
    target = target_of(leak.pid)
    assert cgroup_memory_limit(leak.pid) == 300 * MiB
    cgroup_probe, process_probe = CgroupProbe(), ProcessProbe()
    first = values(cgroup_probe.collect(target, time.time()), "cgroup")
    rss_first = values(process_probe.collect(target, time.time()), "process")["rss_anon_bytes"]
    time.sleep(1.0)
    last = values(cgroup_probe.collect(target, time.time()), "cgroup")
    rss_last = values(process_probe.collect(target, time.time()), "process")["rss_anon_bytes"]
    assert first["cgroup_memory_limit_bytes"] == last["cgroup_memory_limit_bytes"] == 300 * MiB
    assert first["cgroup_memory_usage_bytes"] >= rss_first  # the child's anonymous pages are charged here
    grown, charged = (
        rss_last - rss_first,
        last["cgroup_memory_usage_bytes"] - first["cgroup_memory_usage_bytes"],
    )
    assert grown >= 4 * MiB
    assert abs(charged - grown) < 2 * MiB, (charged, grown)  # usage tracks the child
    assert last["cgroup_memory_working_set_bytes"] <= last["cgroup_memory_usage_bytes"]
    assert last["cgroup_memory_anon_bytes"] >= rss_last - MiB
    assert last["cgroup_oom_kills_total"] == 0 and last["cgroup_memory_limit_hits_total"] == 0


@pytest.mark.root
def test_real_v1_cpu_cgroup_quota_and_throttling(child_cgroups):
    cgroup = child_cgroups.create("cpu", {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "20000"})
    spinner = child_cgroups.start(cgroup, [sys.executable, "-c", "while True: pass"])
    wait_until(lambda: str(spinner.pid) in (cgroup / "cgroup.procs").read_text().split(), 5)
    target = target_of(spinner.pid)
    probe = CgroupProbe()
    first = values(probe.collect(target, time.time()), "cgroup")
    assert first["cgroup_cpu_quota_cores"] == pytest.approx(0.2)

    def throttled() -> dict | None:
        """The probe's figures once the spinner was throttled a tenth of a second more, in three periods
        or more: it runs only when a core is free, so on a loaded host that takes longer than on a quiet one."""
        last = values(probe.collect(target, time.time()), "cgroup")
        seconds, periods = "cgroup_cpu_throttled_seconds_total", "cgroup_cpu_throttled_periods_total"
        enough = last[seconds] > first[seconds] + 0.1 and last[periods] >= first[periods] + 3
        return last if enough else None

    last = wait_until(throttled, 60, interval=0.1)
    assert last["cgroup_cpu_periods_total"] > first["cgroup_cpu_periods_total"]


# --------------------------------------------------------------------------- a real permission error

_PROBE_SCRIPT = """
import json, os, sys
from agent.core.errors import ProbeError
from agent.core.records import ProbeTarget
from probes.linux.procfs import process_identity
from probes.process import ProcessProbe
from probes.smaps import SmapsProbe

pid = int(sys.argv[1])
target = ProbeTarget("locked", pid, process_identity(pid).start_time)
cap_eff = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff:")][0]
result = ProcessProbe().collect(target, 0.0)
out = {
    "uid": os.getuid(),
    "cap_eff": cap_eff,
    "metrics": sorted(sample.metric for sample in result.samples),
    "problems": [[type(p).__name__, str(p)] for p in result.problems],
}
try:
    SmapsProbe().collect(target, 0.0)
    out["smaps"] = None
except ProbeError as exc:
    out["smaps"] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""
NO_CAPABILITIES = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _run_probes_on(pid: int, prefix: list[str]) -> dict:
    done = subprocess.run(
        [*prefix, sys.executable, "-c", _PROBE_SCRIPT, str(pid)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.root
def test_real_permission_error_is_partial_for_process_and_total_for_smaps(spawn):
    """How to get a real EACCES from /proc here: run the probes as uid 0 *without capabilities*
    (`setpriv --bounding-set=-all --inh-caps=-all`: the exec'd interpreter gets empty permitted and
    effective sets) against a target running as `nobody`. Switching the prober to another uid is not
    possible because the interpreter lives under /root (0700). Without CAP_SYS_PTRACE the prober fails
    the kernel's ptrace access check, so `/proc/PID/fd` and `smaps_rollup` give EACCES, while `stat`,
    `statm` and `status` stay world-readable."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to start a target as nobody and drop capabilities")
    target = spawn([*AS_NOBODY, "sleep", "60"])
    wait_until(
        lambda: (
            procstatus.read_status(target.pid).real_uid == 65534
            and procfs.read_stat(target.pid).comm == "sleep"
        )
    )

    privileged = _run_probes_on(target.pid, [])
    assert "open_fds" in privileged["metrics"] and privileged["smaps"] is None  # the control

    locked = _run_probes_on(target.pid, NO_CAPABILITIES)
    assert locked["uid"] == 0 and int(locked["cap_eff"], 16) == 0
    assert "rss_bytes" in locked["metrics"] and "cpu_seconds_total" in locked["metrics"]
    assert "open_fds" not in locked["metrics"]
    [(kind, message)] = locked["problems"]
    assert kind == ProbeAccessDenied.__name__
    assert f"/proc/{target.pid}/fd" in message and "CAP_SYS_PTRACE" in message
    kind, message = locked["smaps"]
    assert kind == ProbeAccessDenied.__name__ and "smaps_rollup" in message and str(target.pid) in message
