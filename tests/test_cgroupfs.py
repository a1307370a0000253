"""Cgroup discovery (probes.linux.cgroupfs) and cgroup files (probes.linux.cgroupfiles): a real hybrid
v1 capture, a v2 tree in the kernel-documented format, container layouts built in tmp_path, fuzzing,
and this machine's own cgroups."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.errors import ProbeError, ProbeUnavailable, TargetGone
from probes.linux import cgroupfiles, cgroupfs
from probes.linux.cgroupfs import CgroupMount, ControllerDir

FIXTURES = Path(__file__).parent / "fixtures"
V1_ROOT, V1_PID = FIXTURES / "cgroup_v1", 9740
V2_ROOT, V2_PID = FIXTURES / "cgroup_v2", 4321
V2_CONTAINER = (
    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-abcd.scope"
)
MiB = 2**20


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


# --------------------------------------------------------------------------- /proc/PID/cgroup, mountinfo


def test_proc_cgroup_lines_of_a_hybrid_host():
    memberships = cgroupfs.parse_proc_cgroup((V1_ROOT / f"proc/{V1_PID}/cgroup").read_bytes())
    by_controllers = {m.controllers: m for m in memberships}
    assert by_controllers[("memory",)].path == "/process_api/session/medic-fixture"
    assert by_controllers[("cpu",)].path == "/medic-fixture"
    assert by_controllers[("name=systemd",)].hierarchy_id == 9
    assert by_controllers[()].hierarchy_id == 0 and by_controllers[()].path == "/medic-fixture"


def test_proc_cgroup_co_mounted_controllers_and_colons_in_paths():
    [member] = cgroupfs.parse_proc_cgroup(b"3:cpu,cpuacct:/a:b/c\n")
    assert member.controllers == ("cpu", "cpuacct") and member.path == "/a:b/c"


@pytest.mark.parametrize("data", [b"", b"memory:/x\n", b"x:memory:/a\n", b"4:memory:relative\n"])
def test_malformed_proc_cgroup(data):
    with pytest.raises(ProbeError, match="/proc/PID/cgroup"):
        cgroupfs.parse_proc_cgroup(data)


def test_mountinfo_of_the_hybrid_capture():
    mounts = cgroupfs.parse_mountinfo((V1_ROOT / "proc/self/mountinfo").read_bytes())
    by_point = {m.mount_point: m for m in mounts}
    assert by_point["/sys/fs/cgroup/memory"] == CgroupMount("/sys/fs/cgroup/memory", "/", 1, ("memory",))
    assert by_point["/sys/fs/cgroup/systemd"].controllers == ("name=systemd",)
    assert by_point["/sys/fs/cgroup/unified"].version == 2
    assert "/sys/fs/cgroup" not in by_point  # the tmpfs holding them is not a cgroup mount
    assert cgroupfs.cgroup_layout(mounts) == "hybrid"


def test_mountinfo_unescapes_and_reads_optional_fields():
    data = (
        rb"30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 master:1 - cgroup2 cgroup2 rw,nsdelegate" + b"\n"
        rb"31 23 0:27 /docker/abc /my\040cgroups/cpu rw - cgroup cgroup rw,cpu,cpuacct" + b"\n"
    )
    v2, v1 = cgroupfs.parse_mountinfo(data)
    assert (v2.mount_point, v2.version) == ("/sys/fs/cgroup", 2)
    assert v1 == CgroupMount("/my cgroups/cpu", "/docker/abc", 1, ("cpu", "cpuacct"))


def test_mounts_are_parsed_again_only_when_mountinfo_changed(tmp_path):
    mountinfo = tmp_path / "proc/self/mountinfo"
    mountinfo.parent.mkdir(parents=True)
    mountinfo.write_text("1 0 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    first = cgroupfs.cgroup_mounts(tmp_path)
    assert cgroupfs.cgroup_mounts(tmp_path) is first and cgroupfs.cgroup_layout(first) == "v2"
    mountinfo.write_text("2 0 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
    assert cgroupfs.cgroup_layout(cgroupfs.cgroup_mounts(tmp_path)) == "v1"


def test_layouts():
    v1 = CgroupMount("/sys/fs/cgroup/memory", "/", 1, ("memory",))
    v2 = CgroupMount("/sys/fs/cgroup", "/", 2, ())
    named_only = CgroupMount("/sys/fs/cgroup/systemd", "/", 1, ("name=systemd",))
    assert cgroupfs.cgroup_layout([v1]) == "v1"
    assert cgroupfs.cgroup_layout([v2, named_only]) == "v2"
    assert cgroupfs.cgroup_layout([v1, v2]) == "hybrid"
    assert cgroupfs.cgroup_layout([]) == "none"


def test_malformed_mountinfo():
    with pytest.raises(ProbeError, match="mountinfo"):
        cgroupfs.parse_mountinfo(b"31 23 0:27 / /sys/fs/cgroup/cpu rw cgroup cgroup rw,cpu\n")


@pytest.mark.parametrize(
    "mount_root, cgroup_path, expected",
    [
        ("/", "/", "/sys/fs/cgroup/memory"),
        ("/", "/a/b", "/sys/fs/cgroup/memory/a/b"),
        ("/docker/abc", "/docker/abc", "/sys/fs/cgroup/memory"),  # a container without a cgroup namespace
        ("/docker/abc", "/docker/abc/worker", "/sys/fs/cgroup/memory/worker"),
        ("/docker/abc", "/docker/abcdef", None),  # a sibling that shares a prefix is not inside
        ("/docker/abc", "/other", None),
        ("/", "/../../outside", None),  # outside our cgroup namespace: not reachable from here
    ],
)
def test_resolve_directory(mount_root, cgroup_path, expected):
    mount = CgroupMount("/sys/fs/cgroup/memory", mount_root, 1, ("memory",))
    assert cgroupfs.resolve_directory(mount, cgroup_path) == expected


# --------------------------------------------------------------------------- small file formats


def test_limits_and_sentinels():
    assert cgroupfiles.parse_v1_limit(b"9223372036854771712\n") is None
    assert cgroupfiles.parse_v1_limit(b"9223372036854710272\n") is None  # the sentinel with 64 KiB pages
    assert cgroupfiles.parse_v1_limit(b"314572800\n") == 300 * MiB
    assert cgroupfiles.parse_v2_limit(b"max\n") is None
    assert cgroupfiles.parse_v2_limit(b"536870912\n") == 512 * MiB
    with pytest.raises(ProbeError, match=r"memory\.max"):
        cgroupfiles.parse_v2_limit(b"lots\n")


def test_cpu_quotas():
    assert cgroupfiles.parse_cpu_max(b"max 100000\n") == cgroupfiles.CpuQuota(None, 0.1)
    assert cgroupfiles.parse_cpu_max(b"150000 100000\n").quota_cores == pytest.approx(1.5)
    assert cgroupfiles.v1_cpu_quota(-1, 100000).quota_cores is None
    assert cgroupfiles.v1_cpu_quota(20000, 100000).quota_cores == pytest.approx(0.2)
    with pytest.raises(ProbeError, match="period"):
        cgroupfiles.parse_cpu_max(b"50000 0\n")
    with pytest.raises(ProbeError, match="cfs_period_us"):
        cgroupfiles.v1_cpu_quota(20000, 0)


def test_pressure_totals_are_seconds():
    pressure = cgroupfiles.parse_pressure(
        (V1_ROOT / "sys/fs/cgroup/unified/medic-fixture/cpu.pressure").read_bytes()
    )
    assert pressure.some.total_seconds == pytest.approx(2.564239)
    assert pressure.some.avg10 == pytest.approx(14.12)
    assert pressure.full is not None
    some_only = cgroupfiles.parse_pressure(b"some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n")
    assert some_only.full is None and some_only.some.total_seconds == pytest.approx(5e-6)
    with pytest.raises(ProbeError, match="no 'some' line"):
        cgroupfiles.parse_pressure(b"full avg10=0.00 avg60=0.00 avg300=0.00 total=5\n")


def test_memory_stat_keeps_what_medic_uses():
    v1 = cgroupfiles.parse_memory_stat(
        (V1_ROOT / "sys/fs/cgroup/memory/process_api/session/medic-fixture/memory.stat").read_bytes()
    )
    assert v1["hierarchical_memory_limit"] == 300 * MiB and v1["total_rss"] == 48984064
    assert "rss_huge" not in v1 and "total_rss_huge" not in v1
    v2 = cgroupfiles.parse_memory_stat((V2_ROOT / f"sys/fs/cgroup{V2_CONTAINER}/memory.stat").read_bytes())
    assert (v2["anon"], v2["file"], v2["inactive_file"]) == (268435456, 125829120, 104857600)
    assert "file_mapped" not in v2
    with pytest.raises(ProbeError, match=r"memory\.stat"):
        cgroupfiles.parse_memory_stat(b"pgfault 12\n")


def test_flat_keyed_files():
    assert (
        cgroupfiles.parse_flat_keyed(b"oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", "x")["oom_kill"] == 2
    )
    with pytest.raises(ProbeError, match="not 'key value'"):
        cgroupfiles.parse_flat_keyed(b"nr_periods\n", "cpu.stat")


# --------------------------------------------------------------------------- whole trees


def test_hybrid_v1_capture_end_to_end():
    location = cgroupfs.locate_cgroups(V1_PID, V1_ROOT)
    assert location.layout == "hybrid"
    assert location.memory.version == 1 and location.memory.path.endswith(
        "/memory/process_api/session/medic-fixture"
    )
    assert location.cpu.version == 1 and location.cpu.path.endswith("/cpu/medic-fixture")
    assert location.unified.version == 2 and location.unified.path.endswith("/unified/medic-fixture")
    problems: list[Exception] = []
    memory = cgroupfiles.read_memory(location.memory, problems)
    assert memory == cgroupfiles.CgroupMemory(
        limit_bytes=300 * MiB,
        usage_bytes=49377280,
        working_set_bytes=49377280,  # total_inactive_file was 0
        anon_bytes=48984064,
        file_bytes=0,
        oom_kills=0,
        limit_hits=0,
    )
    cpu = cgroupfiles.read_cpu(location.cpu, problems)
    assert cpu == cgroupfiles.CgroupCpu(
        periods=35, throttled_periods=33, throttled_seconds=pytest.approx(2.561798214)
    )
    assert cgroupfiles.read_cpu_quota(location.cpu, problems).quota_cores == pytest.approx(0.2)
    assert cgroupfiles.read_pressure(location.unified, "memory", problems).some.total_seconds == 0
    assert problems == []
    assert cgroupfiles.cgroup_memory_limit(V1_PID, V1_ROOT) == 300 * MiB


def test_v1_walk_over_ancestors_matches_hierarchical_limit():
    location = cgroupfs.locate_cgroups(V1_PID, V1_ROOT)
    chain = cgroupfs.ancestors(location.memory)
    assert [Path(p).name for p in chain] == ["medic-fixture", "session", "process_api", "memory"]
    assert cgroupfiles.effective_limit(location.memory, []) == 300 * MiB


def test_v2_tree_end_to_end_with_a_tighter_parent_limit():
    location = cgroupfs.locate_cgroups(V2_PID, V2_ROOT)
    assert location.layout == "v2"
    assert location.memory == location.cpu == location.unified
    assert location.memory.path.endswith(V2_CONTAINER)
    problems: list[Exception] = []
    memory = cgroupfiles.read_memory(location.memory, problems)
    assert memory.limit_bytes == 512 * MiB  # the pod's memory.max, below the container's 1 GiB
    assert memory.usage_bytes == 402653184
    assert memory.working_set_bytes == 402653184 - 104857600
    assert (memory.anon_bytes, memory.file_bytes, memory.oom_kills, memory.limit_hits) == (
        268435456,
        125829120,
        1,
        17,
    )
    cpu = cgroupfiles.read_cpu(location.cpu, problems)
    assert (cpu.periods, cpu.throttled_periods, cpu.throttled_seconds) == (1200, 310, pytest.approx(42.5))
    assert cgroupfiles.read_cpu_quota(location.cpu, problems).quota_cores == pytest.approx(0.5)
    memory_psi = cgroupfiles.read_pressure(location.unified, "memory", problems)
    assert memory_psi.some.total_seconds == pytest.approx(3.25) and memory_psi.full.total_seconds == 1.2
    assert problems == []
    assert cgroupfiles.cgroup_memory_limit(V2_PID, V2_ROOT) == 512 * MiB


def test_v2_inside_a_cgroup_namespace_reads_the_mounted_cgroup_own_limit(tmp_path):
    """In a container with its own cgroup namespace the process sits at `/` of a mount whose top is
    the container's cgroup: its memory.max is the limit (on a real root it would not exist)."""
    root = write_tree(
        tmp_path,
        {
            "proc/7/cgroup": "0::/\n",
            "proc/self/mountinfo": "1 0 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
            "sys/fs/cgroup/cgroup.controllers": "cpu memory pids\n",
            "sys/fs/cgroup/memory.max": "268435456\n",
            "sys/fs/cgroup/memory.current": "1000\n",
        },
    )
    assert cgroupfiles.cgroup_memory_limit(7, root) == 256 * MiB
    problems: list[Exception] = []
    memory = cgroupfiles.read_memory(cgroupfs.locate_cgroups(7, root).memory, problems)
    assert (memory.usage_bytes, memory.oom_kills, memory.working_set_bytes) == (1000, None, None)
    assert problems == []  # missing memory.stat / memory.events are figures this host lacks


def test_v1_container_without_namespace_uses_the_mount_root(tmp_path):
    root = write_tree(
        tmp_path,
        {
            "proc/8/cgroup": "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n",
            "proc/self/mountinfo": (
                "1 0 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
                "2 0 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n"
            ),
            "sys/fs/cgroup/memory/memory.stat": "cache 0\nrss 4096\nhierarchical_memory_limit 1073741824\n",
            "sys/fs/cgroup/memory/memory.usage_in_bytes": "4096\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
    )
    location = cgroupfs.locate_cgroups(8, root)
    assert location.layout == "v1" and location.unified is None
    assert location.cpu.path.endswith("/sys/fs/cgroup/cpu,cpuacct")
    assert cgroupfiles.cgroup_memory_limit(8, root) == 1024 * MiB
    assert cgroupfiles.read_cpu_quota(location.cpu, []).quota_cores is None


def test_hybrid_v2_tree_without_memory_controller_is_not_used_for_memory(tmp_path):
    root = write_tree(
        tmp_path,
        {
            "proc/9/cgroup": "0::/\n",
            "proc/self/mountinfo": "1 0 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
            "sys/fs/cgroup/unified/cgroup.controllers": "hugetlb\n",
        },
    )
    location = cgroupfs.locate_cgroups(9, root)
    assert location.memory is None and location.cpu is None and location.unified is not None
    assert cgroupfiles.cgroup_memory_limit(9, root) is None


def test_unreadable_file_is_a_problem_missing_file_is_not(tmp_path):
    directory = ControllerDir(str(tmp_path), str(tmp_path), 2)
    (tmp_path / "memory.current").mkdir()  # reading a directory fails with EISDIR
    (tmp_path / "memory.stat").write_text("anon 1\nfile 2\ninactive_file 1\n")
    problems: list[Exception] = []
    memory = cgroupfiles.read_memory(directory, problems)
    assert memory.usage_bytes is None and memory.anon_bytes == 1
    assert len(problems) == 1 and "memory.current" in str(problems[0])
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert cgroupfiles.read_cpu_quota(directory, problems) is None
    assert "cpu.max" in str(problems[-1])


def test_members_of_a_cgroup_with_and_without_child_cgroups(tmp_path):
    directory = ControllerDir(str(tmp_path), str(tmp_path), 2)
    (tmp_path / "cgroup.procs").write_text("41\n42\n")
    assert cgroupfiles.cgroup_members(directory, 2) == (41, 42)
    assert cgroupfiles.cgroup_members(directory, 1) is None  # more processes than the instance has
    (tmp_path / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in range(1000, 3000)))
    assert cgroupfiles.cgroup_members(directory, 3) is None  # a long file is not read whole to say so
    (tmp_path / "cgroup.procs").write_text("41\n")
    (tmp_path / "child").mkdir()
    assert cgroupfiles.cgroup_members(directory, 2) is None  # its usage holds a child cgroup's
    assert cgroupfiles.has_subdirectories(str(tmp_path))
    (tmp_path / "child").rmdir()
    assert not cgroupfiles.has_subdirectories(str(tmp_path))
    assert cgroupfiles.cgroup_members(ControllerDir(str(tmp_path / "gone"), str(tmp_path), 2), 2) is None


def test_no_cgroup_filesystem_and_vanished_pid(tmp_path):
    root = write_tree(
        tmp_path, {"proc/5/cgroup": "0::/\n", "proc/self/mountinfo": "1 0 0:1 / / rw - ext4 /dev/x rw\n"}
    )
    with pytest.raises(ProbeUnavailable, match="no cgroup filesystem"):
        cgroupfs.locate_cgroups(5, root)
    with pytest.raises(TargetGone):
        cgroupfs.locate_cgroups(6, root)


# --------------------------------------------------------------------------- this machine


def test_this_process_cgroups_on_this_machine():
    location = cgroupfs.locate_cgroups(os.getpid())
    own = cgroupfs.parse_proc_cgroup(Path("/proc/self/cgroup").read_bytes())
    memory_line = [m for m in own if "memory" in m.controllers]
    if memory_line:  # v1 or hybrid, as on this project's machines
        assert location.memory.version == 1
        assert location.memory.path.rstrip("/").endswith(memory_line[0].path.rstrip("/"))
    assert location.memory is None or os.path.isdir(location.memory.path)
    problems: list[Exception] = []
    if location.memory:
        assert cgroupfiles.read_memory(location.memory, problems).usage_bytes > 0
    assert problems == []


# --------------------------------------------------------------------------- fuzzing


def _v1(name: str) -> bytes:
    return (V1_ROOT / "sys/fs/cgroup/memory/process_api/session/medic-fixture" / name).read_bytes()


PARSERS = {
    "proc_cgroup": (cgroupfs.parse_proc_cgroup, (V1_ROOT / f"proc/{V1_PID}/cgroup").read_bytes()),
    "mountinfo": (cgroupfs.parse_mountinfo, (V1_ROOT / "proc/self/mountinfo").read_bytes()),
    "memory_stat": (cgroupfiles.parse_memory_stat, _v1("memory.stat")),
    "flat_keyed": (
        lambda data: cgroupfiles.parse_flat_keyed(data, "memory.oom_control"),
        _v1("memory.oom_control"),
    ),
    "int": (lambda data: cgroupfiles.parse_int(data, "memory.usage_in_bytes"), _v1("memory.usage_in_bytes")),
    "v1_limit": (cgroupfiles.parse_v1_limit, _v1("memory.limit_in_bytes")),
    "v2_limit": (cgroupfiles.parse_v2_limit, b"max\n"),
    "pressure": (
        cgroupfiles.parse_pressure,
        (V2_ROOT / f"sys/fs/cgroup{V2_CONTAINER}/cpu.pressure").read_bytes(),
    ),
    "cpu_max": (cgroupfiles.parse_cpu_max, b"50000 100000\n"),
}


def _only_probe_errors(parse, data: bytes) -> None:
    with contextlib.suppress(ProbeError):  # any other exception fails the test
        parse(data)


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=300))
def test_garbage_gives_probe_error_only(name, data):
    _only_probe_errors(PARSERS[name][0], data)


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_mutated_real_files_give_probe_error_only(name, data):
    parse, original = PARSERS[name]
    start = data.draw(st.integers(0, len(original)))
    end = data.draw(st.integers(start, len(original)))
    insert = data.draw(
        st.binary(max_size=16) | st.sampled_from([b"", b"\n", b" ", b":", b" - ", b"=", b"9" * 5000])
    )
    _only_probe_errors(parse, original[:start] + insert + original[end:])


@given(
    mount_root=st.sampled_from(["/", "/docker/abc", "/a"]),
    cgroup_path=st.text(alphabet="/.ab", max_size=20).map(lambda s: "/" + s),
)
def test_resolve_directory_never_escapes_the_mount(mount_root, cgroup_path):
    mount = CgroupMount("/sys/fs/cgroup/memory", mount_root, 1, ("memory",))
    found = cgroupfs.resolve_directory(mount, cgroup_path)
    if found is not None:
        assert found == "/sys/fs/cgroup/memory" or found.startswith("/sys/fs/cgroup/memory/")
        assert ".." not in found.split("/")
