"""/proc parsing: captured real files (tests/fixtures/proc), fuzzing, and the live /proc of this machine."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.errors import ProbeAccessDenied, ProbeError, ProbeUnavailable, TargetGone
from native_hooks.sockets import candidate_paths, namespace_pids
from probes.linux import maps, procfs, procstatus

ROOT = Path(__file__).parent / "fixtures" / "proc"
FIXTURE = ROOT / "proc"
WEIRD, KTHREAD, ZOMBIE, NESTED = 10299, 2, 10300, 16791  # see tests/fixtures/README.md
BTIME = 1795954422


def fixture_bytes(*parts: str | int) -> bytes:
    return FIXTURE.joinpath(*map(str, parts)).read_bytes()


# --------------------------------------------------------------------------- stat


def test_stat_keeps_a_comm_with_spaces_and_parentheses():
    stat = procfs.parse_stat(fixture_bytes(WEIRD, "stat"), clock_ticks=100)
    assert stat.pid == WEIRD
    assert stat.comm == "x) R 1 (y z"
    assert stat.state == "S"
    assert stat.ppid == 10258
    assert stat.minor_faults == 74
    assert stat.major_faults == 0
    assert stat.threads == 1
    assert stat.start_seconds_after_boot == pytest.approx(541.24)


def test_stat_of_a_zombie_and_a_kernel_thread():
    assert procfs.parse_stat(fixture_bytes(ZOMBIE, "stat")).state == "Z"
    kthread = procfs.parse_stat(fixture_bytes(KTHREAD, "stat"), clock_ticks=100)
    assert (kthread.comm, kthread.ppid, kthread.start_seconds_after_boot) == ("kthreadd", 0, 0.32)


@given(
    comm=st.binary(min_size=0, max_size=15).filter(lambda b: b"\0" not in b),
    utime=st.integers(0, 2**40),
    stime=st.integers(0, 2**40),
    threads=st.integers(1, 100000),
    start=st.integers(0, 2**40),
    ticks=st.sampled_from([100, 250, 1000]),
)
def test_stat_round_trip_with_any_comm(comm, utime, stime, threads, start, ticks):
    fields = ["S", "1", "1", "1", "0", "-1", "0", "7", "0", "9", "0", str(utime), str(stime)]
    fields += ["0", "0", "20", "0", str(threads), "0", str(start), "1000", "10"]
    data = b"4242 (" + comm + b") " + " ".join(fields).encode() + b"\n"
    stat = procfs.parse_stat(data, clock_ticks=ticks)
    assert stat.comm == comm.decode("utf-8", "replace")
    assert stat.cpu_seconds == pytest.approx((utime + stime) / ticks)
    assert (stat.minor_faults, stat.major_faults, stat.threads) == (7, 9, threads)
    assert stat.start_seconds_after_boot == pytest.approx(start / ticks)


@pytest.mark.parametrize(
    "data",
    [b"", b"4242", b"4242 (sleep) S 1 2", b"abc (x) " + b"1 " * 30, b"4242 (x) S " + b"zz " * 30],
)
def test_malformed_stat_says_which_file(data):
    with pytest.raises(ProbeError, match=r"malformed /proc/PID/stat"):
        procfs.parse_stat(data)


# --------------------------------------------------------------------------- statm, status, smaps_rollup


def test_statm_pages_become_bytes():
    statm = procfs.parse_statm(fixture_bytes(WEIRD, "statm"), page_size=4096)
    assert (statm.vms_bytes, statm.rss_bytes, statm.shared_bytes) == (730 * 4096, 439 * 4096, 412 * 4096)
    assert procfs.parse_statm(b"1 2 3 4 5 6 7", page_size=65536).rss_bytes == 2 * 65536


def test_status_sizes_in_bytes_and_counters():
    status = procstatus.parse_status(fixture_bytes(WEIRD, "status"))
    assert status.rss_bytes == 1756 * 1024
    assert status.rss_anon_bytes == 108 * 1024
    assert status.rss_file_bytes == 1648 * 1024
    assert status.rss_shmem_bytes == 0
    assert status.rss_peak_bytes == 1756 * 1024
    assert status.swap_bytes == 0
    assert (status.voluntary_ctx_switches, status.involuntary_ctx_switches) == (1, 0)
    assert (status.real_uid, status.effective_uid) == (0, 0)


def test_status_figures_alone_leave_out_who_the_process_is():
    data = fixture_bytes(WEIRD, "status")
    figures, whole = procstatus.parse_status(data, ids=False), procstatus.parse_status(data)
    assert (figures.uids, figures.ns_pids, figures.real_uid, figures.effective_gid) == ((), (), None, None)
    assert figures._replace(uids=whole.uids, ns_pids=whole.ns_pids) == whole._replace(
        real_uid=None, effective_uid=None, effective_gid=None
    )
    assert whole.vms_bytes == 2920 * 1024


def test_status_of_a_kernel_thread_has_no_memory_lines():
    status = procstatus.parse_status(fixture_bytes(KTHREAD, "status"))
    assert status.rss_bytes is None and status.rss_anon_bytes is None and status.swap_bytes is None
    assert status.voluntary_ctx_switches is not None


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "Name:"),
        (b"Name:\tx\nVmRSS:\t12 MB\n", "not in kB"),
        (b"Name:\tx\nVmRSS:\tlots kB\n", "not an integer"),
        (b"Name:\tx\nUid:\t0\n", "Uid"),
    ],
)
def test_malformed_status(data, message):
    with pytest.raises(ProbeError, match=message):
        procstatus.parse_status(data)


def test_smaps_rollup_uss_is_private_clean_plus_dirty():
    rollup = procfs.parse_smaps_rollup(fixture_bytes(WEIRD, "smaps_rollup"))
    assert rollup.rss_bytes == 1756 * 1024
    assert rollup.pss_bytes == 279 * 1024
    assert rollup.uss_bytes == (36 + 108) * 1024
    assert (rollup.swap_bytes, rollup.swap_pss_bytes) == (0, 0)


def test_empty_smaps_rollup_is_an_error_not_zero():
    with pytest.raises(ProbeError, match="empty"):
        procfs.parse_smaps_rollup(b"")
    with pytest.raises(ProbeError, match="missing Pss"):
        procfs.parse_smaps_rollup(b"Rss: 1 kB\nPrivate_Clean: 0 kB\nPrivate_Dirty: 0 kB\n")


# --------------------------------------------------------------------------- stat, meminfo, cmdline, fd


def test_boot_time_and_meminfo():
    assert procfs.parse_boot_time(fixture_bytes("stat")) == BTIME
    assert procfs.host_memory_total(ROOT) == 24684092 * 1024
    meminfo = procfs.parse_meminfo(fixture_bytes("meminfo"))
    assert "HugePages_Total" in meminfo and meminfo["MemTotal"] >= meminfo["MemFree"]
    with pytest.raises(ProbeError, match="btime"):
        procfs.parse_boot_time(b"cpu 1 2 3\n")
    with pytest.raises(ProbeError, match="MemTotal"):
        procfs.parse_meminfo(b"MemFree: 1 kB\n")


def test_cmdline_forms():
    assert procfs.read_cmdline(WEIRD, ROOT) == ["/tmp/cap/x) R 1 (y z", "60", "1s"]
    assert procfs.read_cmdline(ZOMBIE, ROOT) == []
    assert procfs.parse_cmdline(b"nginx: worker process") == ["nginx: worker process"]
    assert procfs.parse_cmdline(b"a\0\0b\0") == ["a", "", "b"]


def test_fd_count_and_identity_from_a_fixture_root():
    assert procfs.count_fds(WEIRD, ROOT) == 3
    identity = procfs.process_identity(WEIRD, ROOT)
    assert identity.pid == WEIRD
    assert identity.start_time == pytest.approx(BTIME + 54124 / procfs.CLOCK_TICKS)


# --------------------------------------------------------------------------- environ, NSpid, maps


def test_environ_keeps_odd_bytes_and_equal_signs():
    env = procfs.read_environ(NESTED, ROOT)
    assert env["EQ"] == "a=b=c" and env["EMPTY"] == ""
    assert os.fsencode(env["ODD"]) == b"caf\xe9\x01tab\there"  # a non-UTF-8 byte survives a round trip
    assert env["JAVA_TOOL_OPTIONS"] == "-Xrs -Dx=1"


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", {}),
        (b"A=1", {"A": "1"}),
        (b"A=1\0\0NOEQUALS\0=nokey\0B=\0", {"A": "1", "B": ""}),
        (b"A=1\0A=2\0", {"A": "2"}),
        (b"K\xff=v\xfe\0", {os.fsdecode(b"K\xff"): os.fsdecode(b"v\xfe")}),
    ],
)
def test_parse_environ_forms(data, expected):
    assert procfs.parse_environ(data) == expected


def test_environ_of_a_vanished_pid_is_target_gone():
    with pytest.raises(TargetGone):
        procfs.read_environ(999999, ROOT)


@given(
    st.dictionaries(
        st.binary(min_size=1).filter(lambda k: b"=" not in k and b"\0" not in k),
        st.binary().filter(lambda v: b"\0" not in v),
        max_size=8,
    )
)
def test_environ_round_trips_any_bytes(env):
    raw = b"".join(key + b"=" + value + b"\0" for key, value in env.items())
    decoded = procfs.parse_environ(raw)
    assert {os.fsencode(k): os.fsencode(v) for k, v in decoded.items()} == env


def test_nspid_of_a_process_two_pid_namespaces_down():
    assert procstatus.read_nspid(NESTED, ROOT) == (NESTED, 2, 1)
    assert procstatus.read_status(NESTED, ROOT).uids == (0, 0, 0, 0)
    assert procstatus.read_nspid(WEIRD, ROOT) == (WEIRD,)
    assert namespace_pids(NESTED, ROOT) == {NESTED, 2, 1}
    assert namespace_pids(999999, ROOT) == {999999}  # unreadable: only the pid itself


def test_nspid_absent_on_old_kernels_is_the_pid_itself(tmp_path):
    status = fixture_bytes(NESTED, "status")
    old = b"".join(line for line in status.splitlines(keepends=True) if not line.startswith(b"NSpid:"))
    (tmp_path / "proc" / "77").mkdir(parents=True)
    (tmp_path / "proc" / "77" / "status").write_bytes(old)
    assert procstatus.read_nspid(77, tmp_path) == (77,)


def test_hook_socket_candidates_of_a_nested_pid_go_through_its_root():
    paths = candidate_paths(NESTED, ROOT, env={})
    assert "/tmp/medic-0/hook.1.sock" in paths
    assert f"{FIXTURE}/{NESTED}/root/tmp/medic-0/hook.1.sock" in paths


def test_maps_with_spaces_deleted_files_and_kernel_mappings():
    mappings = maps.read_maps(NESTED, ROOT)
    assert len(mappings) == 24
    exe = mappings[1]
    assert exe.path == "/tmp/cap13/my dir/sl eep (deleted)" and exe.deleted and exe.executable
    assert (exe.start, exe.end, exe.offset, exe.dev, exe.inode) == (
        0x55AD88DED000,
        0x55AD88DF2000,
        0x2000,
        "fe:00",
        2146604,
    )
    assert [m.path for m in mappings if m.path.startswith("[")] == [
        "[heap]",
        "[vvar]",
        "[vvar_vclock]",
        "[vdso]",
        "[stack]",
        "[vsyscall]",
    ]
    anonymous = mappings[6]
    assert (anonymous.path, anonymous.inode, anonymous.deleted) == ("", 0, False)
    assert mappings[-1].end == 0xFFFFFFFFFF601000


@pytest.mark.parametrize(
    "line, path",
    [
        ("1000-2000 r-xp 0 08:01 7   /opt/my app/lib.so (deleted)", "/opt/my app/lib.so (deleted)"),
        ("1000-2000 rw-p 00000000 00:00 0 ", ""),
        ("1000-2000 rw-p 00000000 00:00 0", ""),
        ("1000-2000 r--s 00000000 00:05 9 /memfd:x (deleted)", "/memfd:x (deleted)"),
        ("1000-2000 r--p 00000000 fe:00 9 /a\\012b", "/a\\012b"),  # the kernel escapes a newline
    ],
)
def test_maps_line_forms(line, path):
    mapping = maps.parse_maps_line(line)
    assert mapping is not None and mapping.path == path


@pytest.mark.parametrize(
    "line",
    [
        "",
        "garbage",
        "2000-1000 r-xp 0 08:01 7",
        "1000-2000 rwx 0 08:01 7 /x",
        "1000-20000000000000000 r-xp 0 08:01 7 /x",
    ],
)
def test_lines_that_are_not_maps_lines(line):
    assert maps.parse_maps_line(line) is None


def test_maps_error_names_the_line():
    with pytest.raises(ProbeError, match="line 2 is not in the kernel's format"):
        maps.parse_maps(b"00400000-00401000 r-xp 00000000 fe:00 123 /bin/x\nnonsense\n")
    with pytest.raises(TargetGone):
        maps.read_maps(999999, ROOT)


_MAPS_LINE = st.tuples(
    st.integers(0, 2**47),
    st.integers(0, 2**30),
    st.sampled_from(["r--p", "r-xp", "rw-p", "---p", "rw-s"]),
    st.integers(0, 2**32),
    st.integers(0, 2**32),
    st.binary(max_size=30).filter(lambda b: b"\n" not in b and not b[:1].isspace()),
)


@given(st.lists(_MAPS_LINE, max_size=20))
def test_parse_maps_round_trip(fields):
    lines = [
        f"{start:x}-{start + length:x} {perms} {offset:08x} fe:00 {inode}    ".encode() + path
        for start, length, perms, offset, inode, path in fields
    ]
    mappings = maps.parse_maps(b"\n".join(lines) + b"\n")
    assert [
        (m.start, m.end - m.start, m.perms, m.offset, m.inode, os.fsencode(m.path)) for m in mappings
    ] == fields


# --------------------------------------------------------------------------- errors at the edge


def test_vanished_pid_is_target_gone():
    with pytest.raises(TargetGone, match="process 999999 is gone"):
        procfs.read_statm(999999, ROOT)
    with pytest.raises(TargetGone):
        procfs.count_fds(999999, ROOT)


def test_missing_file_of_a_live_pid_is_unavailable():
    with pytest.raises(ProbeUnavailable, match="does not exist on this kernel"):
        procfs.read_smaps_rollup(KTHREAD, ROOT)
    with pytest.raises(ProbeUnavailable, match="is /proc mounted"):
        procfs.host_memory_total(ROOT / "nowhere")


def test_os_errors_map_to_the_probe_family():
    path = "/proc/42/smaps_rollup"
    denied = procfs.translate_os_error(PermissionError(errno.EACCES, "Permission denied"), path, 42)
    assert isinstance(denied, ProbeAccessDenied)
    assert "pid 42" in str(denied) and path in str(denied) and "CAP_SYS_PTRACE" in str(denied)
    assert isinstance(procfs.translate_os_error(ProcessLookupError(errno.ESRCH, "x"), path, 42), TargetGone)
    other = procfs.translate_os_error(OSError(errno.EIO, "I/O error"), path, 42)
    assert type(other) is ProbeError and "I/O error" in str(other)


def test_read_live_stat_rejects_zombies_and_reused_pids():
    with pytest.raises(TargetGone, match="zombie"):
        procfs.read_live_stat(ZOMBIE, 0.0, ROOT)
    started = procfs.process_identity(WEIRD, ROOT).start_time
    assert procfs.read_live_stat(WEIRD, started, ROOT).pid == WEIRD
    with pytest.raises(TargetGone, match="belongs to another process"):
        procfs.read_live_stat(WEIRD, started - 5, ROOT)


# --------------------------------------------------------------------------- the live /proc


def test_identity_of_this_process_matches_psutil():
    identity = procfs.process_identity(os.getpid())
    assert identity.start_time == pytest.approx(psutil.Process().create_time(), abs=0.02)
    assert procfs.process_identity(os.getpid()) == identity


def test_a_new_process_with_a_new_pid_has_a_new_identity(spawn):
    first = spawn([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.DEVNULL)
    second = spawn([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.DEVNULL)
    a, b = procfs.process_identity(first.pid), procfs.process_identity(second.pid)
    assert a != b and a == procfs.process_identity(first.pid)


def test_live_readers_agree_with_psutil():
    pid = os.getpid()
    statm = procfs.read_statm(pid)
    status = procstatus.read_status(pid)
    info = psutil.Process(pid).memory_info()
    assert abs(statm.rss_bytes - info.rss) < 4 << 20
    assert status.rss_bytes is not None and abs(status.rss_bytes - info.rss) < 4 << 20
    assert procfs.count_fds(pid) == psutil.Process(pid).num_fds()
    assert procfs.read_smaps_rollup(pid).pss_bytes > 0


# --------------------------------------------------------------------------- fuzzing: ProbeError or a record


def parse_status_figures(data: bytes) -> procstatus.ProcStatus:
    return procstatus.parse_status(data, ids=False)


PARSERS = [
    procfs.parse_stat,
    procfs.parse_statm,
    procstatus.parse_status,
    parse_status_figures,
    procfs.parse_smaps_rollup,
    procfs.parse_meminfo,
    procfs.parse_boot_time,
    procfs.parse_cmdline,
    procfs.parse_environ,
    maps.parse_maps,
]
SAMPLES = [fixture_bytes(WEIRD, name) for name in ("stat", "statm", "status", "smaps_rollup", "cmdline")] + [
    fixture_bytes("meminfo"),
    fixture_bytes("stat"),
    fixture_bytes(NESTED, "environ"),
    fixture_bytes(NESTED, "maps"),
]


def _only_probe_errors(parse, data: bytes) -> None:
    with contextlib.suppress(ProbeError):  # any other exception fails the test
        parse(data)


@pytest.mark.parametrize("parse", PARSERS, ids=lambda f: f.__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=400))
def test_garbage_gives_probe_error_only(parse, data):
    _only_probe_errors(parse, data)


@pytest.mark.parametrize("parse", PARSERS, ids=lambda f: f.__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_mutated_real_files_give_probe_error_only(parse, data):
    original = data.draw(st.sampled_from(SAMPLES))
    start = data.draw(st.integers(0, len(original)))
    end = data.draw(st.integers(start, len(original)))
    insert = data.draw(
        st.binary(max_size=20) | st.sampled_from([b"", b"\n", b" ", b":", b")", b"-1", b"9" * 5000])
    )
    _only_probe_errors(parse, original[:start] + insert + original[end:])
