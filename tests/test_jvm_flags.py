"""The JVM's own ceilings read from `jcmd VM.flags` and from the options it started with, the heap's address
range in `GC.heap_info`, and the resident bytes of a range in smaps: pure parsers of text a target
controls, checked on captured outputs and on anything hypothesis makes."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.errors import ProbeError
from probes.jvmflags import (
    launcher_options,
    limits_from_options,
    limits_from_vm_flags,
    parse_size,
    startup_options,
)
from probes.jvmtext import parse_heap_info
from probes.linux.maps import parse_smaps_resident

FIXTURES = Path(__file__).parent / "fixtures" / "jvm"
MiB, GiB = 2**20, 2**30
# `jcmd PID VM.flags` of `java -Xmx96m -XX:MaxDirectMemorySize=32m -XX:MaxMetaspaceSize=64m` (OpenJDK 17.0.15)
SET = (
    "29411:\n-XX:CICompilerCount=2 -XX:CompressedClassSpaceSize=67108864 -XX:ConcGCThreads=1 "
    "-XX:G1HeapRegionSize=1048576 -XX:InitialHeapSize=100663296 -XX:MaxDirectMemorySize=33554432 "
    "-XX:MaxHeapSize=100663296 -XX:MaxMetaspaceSize=67108864 -XX:MaxNewSize=59768832 "
    "-XX:SoftMaxHeapSize=100663296 -XX:+UseCompressedClassPointers -XX:+UseCompressedOops -XX:+UseG1GC \n"
)
# ... and of `java -XX:MaxRAMPercentage=50` (nothing else set: MaxHeapSize is the ergonomic one)
ERGONOMIC = (
    "29414:\n-XX:CICompilerCount=2 -XX:InitialHeapSize=402653184 -XX:MaxHeapSize=12641632256 "
    "-XX:MaxRAM=25275990016 -XX:MaxRAMPercentage=50.000000 -XX:+UseG1GC \n"
)


def test_vm_flags_name_each_ceiling_and_a_direct_default_is_the_heaps():
    set_ = limits_from_vm_flags(SET)
    assert set_ is not None and set_.source == "VM.flags"
    assert (set_.heap, set_.direct, set_.metaspace) == (96 * MiB, 32 * MiB, 64 * MiB) and set_.direct_set
    ergonomic = limits_from_vm_flags(ERGONOMIC)
    assert ergonomic is not None and ergonomic.heap == 12641632256
    assert ergonomic.direct == ergonomic.heap and not ergonomic.direct_set  # Runtime.maxMemory()
    assert ergonomic.metaspace is None  # no ceiling of its own
    assert limits_from_vm_flags("29411:\nUnknown diagnostic command") is None
    unlimited = limits_from_vm_flags(
        SET.replace("67108864 -XX:MaxNewSize", "18446744073709551615 -XX:MaxNewSize")
    )
    assert unlimited is not None and unlimited.metaspace is None  # max_uintx: wider than 64 bits


def test_the_command_line_stops_at_the_main_class_and_the_last_setting_wins():
    argv = ["/usr/lib/jvm/bin/java", "-Xmx1g", "-cp", "-Xmx9g", "-Xmx384m", "Main", "-Xmx100g"]
    assert launcher_options(argv) == ["-Xmx1g", "-Xmx384m"]  # -cp's value and the program's own args skipped
    assert launcher_options(["java", "-jar", "app.jar", "-Xmx8g"]) == []
    assert launcher_options(["/opt/app/bin/server", "-Xmx8g"]) == []  # not the java launcher's options
    limits = limits_from_options(launcher_options(argv), None, 8 * GiB)
    assert limits is not None and limits.heap == 384 * MiB and limits.source == "command line"
    assert limits.detail == "-Xmx384m" and limits.direct == 384 * MiB and limits.metaspace is None


def test_environment_options_come_in_the_jvms_order():
    env = {"JAVA_TOOL_OPTIONS": "-Xmx1g -XX:MaxMetaspaceSize=128m", "_JAVA_OPTIONS": "-Xmx2g"}
    options = startup_options(["java", "-Xmx512m", "Main"], env)
    assert options == ["-Xmx1g", "-XX:MaxMetaspaceSize=128m", "-Xmx512m", "-Xmx2g"]
    limits = limits_from_options(options, None, 8 * GiB)
    assert limits is not None and (limits.heap, limits.metaspace) == (2 * GiB, 128 * MiB)
    embedded = startup_options(["/opt/app/server", "-Xmx9g"], {"JDK_JAVA_OPTIONS": "-Xmx3g", **env})
    assert embedded == ["-Xmx1g", "-XX:MaxMetaspaceSize=128m", "-Xmx2g"]  # JDK_JAVA_OPTIONS: java's alone


def test_a_share_of_ram_is_of_the_cgroup_limit_unless_told_otherwise():
    percent = ["-XX:MaxRAMPercentage=75.0", "-XX:MaxDirectMemorySize=64m"]
    in_container = limits_from_options(percent, 640 * MiB, 8 * GiB)
    assert in_container is not None and in_container.heap == 480 * MiB and in_container.direct == 64 * MiB
    assert limits_from_options(percent, None, 8 * GiB).heap == 6 * GiB  # no cgroup limit: the host's RAM
    outside = limits_from_options(["-XX:-UseContainerSupport", *percent], 640 * MiB, 8 * GiB)
    assert outside is not None and outside.heap == 6 * GiB
    assert (
        limits_from_options(["-XX:MaxRAM=1g", "-XX:MaxRAMFraction=4"], 640 * MiB, 8 * GiB).heap == 256 * MiB
    )
    assert limits_from_options(["-Xmx200m", *percent], 640 * MiB, 8 * GiB).heap == 200 * MiB  # -Xmx wins
    assert limits_from_options(["-Xss1m", "-XX:+UseG1GC"], 640 * MiB, 8 * GiB) is None  # nothing said


def test_sizes_as_hotspot_reads_them():
    assert [parse_size(s) for s in ("384m", "2G", "1024k", "402653184", "1t")] == [
        384 * MiB,
        2 * GiB,
        MiB,
        402653184,
        2**40,
    ]
    assert [parse_size(s) for s in ("", "12x", "-1m", "9" * 25, "99999999999999999999t")] == [None] * 5


def test_the_heap_range_of_each_collector():
    spans = {
        name: parse_heap_info((FIXTURES / f"heap_info_{name}.txt").read_text()).span
        for name in ("g1_17", "g1_25", "parallel_17", "serial_17", "shenandoah_17", "z_17")
    }
    assert spans.pop("z_17") is None  # ZGC names no range
    assert set(spans.values()) == {(0xFC000000, 0x100000000)}


def test_smaps_resident_bytes_per_mapping():
    text = (
        b"fc000000-fd100000 rw-p 00000000 00:00 0 \nSize:  17408 kB\nRss:   16384 kB\nPss: 16384 kB\n"
        b"fd100000-100000000 ---p 00000000 00:00 0 \nSize:  48128 kB\nRss:       0 kB\n"
        b"7f0000000000-7f0000001000 r-xp 00000000 08:01 42   /usr/lib/jvm/lib/server/libjvm.so\n"
        b"Rss:       4 kB\nVmFlags: rd ex mr mw me\n"
    )
    assert parse_smaps_resident(text) == [
        (0xFC000000, 0xFD100000, 16 * MiB),
        (0xFD100000, 0x100000000, 0),
        (0x7F0000000000, 0x7F0000001000, 4096),
    ]
    try:
        parse_smaps_resident(b"Rss:  4 kB\n")
    except ProbeError as exc:
        assert "not an smaps file" in str(exc)
    else:
        raise AssertionError("an Rss line before any mapping was accepted")


words = st.one_of(
    st.text(max_size=30).map(lambda s: s.replace("\0", "")),
    st.builds(
        lambda name, value: f"-XX:{name}={value}",
        st.sampled_from(
            ["MaxHeapSize", "MaxDirectMemorySize", "MaxMetaspaceSize", "MaxRAM", "MaxRAMPercentage"]
        ),
        st.one_of(st.integers(0, 10**30).map(str), st.from_regex(r"[0-9.kKmMgGx-]{0,24}", fullmatch=True)),
    ),
    st.builds(
        lambda n, u: f"-Xmx{n}{u}", st.integers(0, 10**25), st.sampled_from(["", "k", "m", "g", "T", "q"])
    ),
    st.sampled_from(["java", "-cp", "-jar", "Main", "-XX:-UseContainerSupport", "-XX:MaxRAMFraction=0"]),
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(words, max_size=30),
    st.dictionaries(st.sampled_from(["JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS"]), st.text(max_size=60)),
    st.one_of(st.none(), st.integers(1, 2**62)),
)
def test_any_options_give_ceilings_within_64_bits_or_none(argv, environ, cgroup):
    limits = limits_from_options(startup_options(argv, environ), cgroup, 8 * GiB)
    if limits is not None:
        for figure in (limits.heap, limits.direct, limits.metaspace):
            assert figure is None or 0 < figure < 2**63
    flags = limits_from_vm_flags(" ".join(argv))
    assert flags is None or 0 < flags.heap < 2**63


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=400),
    st.lists(st.tuples(st.integers(0, 2**64), st.integers(0, 2**64), st.integers(0, 10**25)), max_size=5),
)
def test_any_smaps_parses_or_raises_a_probe_error(noise, regions):
    text = noise + b"".join(b"%x-%x rw-p 0 00:00 0\nRss: %d kB\n" % region for region in regions)
    try:
        parsed = parse_smaps_resident(text)
    except ProbeError:
        return
    assert all(rss % 1024 == 0 and 0 <= rss < 2**63 for _, _, rss in parsed)
