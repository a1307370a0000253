"""Heap-profile parsers: real jemalloc and gperftools dumps of a leaking C program, jeprof as a cross-check,
generated profiles, and truncated or corrupted files (clear errors, never a crash or a half-read profile)."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.core.errors import ProbeError
from native_hooks import heapprofile
from native_hooks.heapprofile import (
    MAPS_MARKER,
    HeapProfileError,
    parse_heap_profile,
    parse_maps_line,
    read_heap_profile,
)
from native_hooks.heapsites import allocation_sites
from native_hooks.symbolize import Symbolizer
from support.histo import build_c, clean_env

MAPS = "55d0c0000000-55d0c0001000 r-xp 00001000 fe:00 42   /opt/app/server\n"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict[str, Path]:
    """Real dumps of the leaking C program: jemalloc (interval + final) and gperftools (HEAPPROFILE)."""
    out = tmp_path_factory.mktemp("dumps")
    binary = build_c(out)
    argv = [binary, "256", "1000", "20"]  # 20 ticks leaking 256 x 4 KiB each: 20 MiB
    je = out / "je"
    je.mkdir()
    conf = f"prof:true,prof_final:true,lg_prof_sample:12,lg_prof_interval:23,prof_prefix:{je}/jeprof"
    subprocess.run(
        argv,
        env=clean_env(LD_PRELOAD="libjemalloc.so.2", MALLOC_CONF=conf),
        check=True,
        capture_output=True,
        timeout=60,
    )
    tc = out / "tc"
    tc.mkdir()
    env = clean_env(
        LD_PRELOAD="libtcmalloc.so.4", HEAPPROFILE=f"{tc}/hp", HEAP_PROFILE_ALLOCATION_INTERVAL=str(8 << 20)
    )
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=60)
    final = next(je.glob("jeprof.*.f.heap"))
    first = min(je.glob("jeprof.*.i*.heap"), key=lambda p: int(p.name.split(".")[2]))
    tc_files = sorted(tc.glob("hp.*.heap"))
    return {
        "binary": Path(binary),
        "je_final": final,
        "je_first": first,
        "tc_final": tc_files[-1],
        "tc_first": tc_files[0],
    }


# ------------------------------------------------------------------------------------------ real dumps
@pytest.mark.native
def test_jemalloc_dump_parses_and_unbiases_samples(dumps):
    profile = read_heap_profile(dumps["je_final"])
    assert profile.format == "jemalloc" and profile.sample_period == 4096
    assert profile.mappings and any(m.path.endswith("leak_sites") for m in profile.mappings)
    sites = allocation_sites(profile, Symbolizer())
    assert sites[0].name == "leak_records"
    leaked = 20 * 256 * 4096
    assert 0.8 * leaked < sites[0].live_bytes < 1.25 * leaked  # sampled every 4 KiB on average, un-biased
    assert sites[0].stack[:2] == ("leak_records", "main")


@pytest.mark.native
def test_gperftools_dump_is_exact(dumps):
    profile = read_heap_profile(dumps["tc_final"])
    assert profile.format == "gperftools" and profile.sample_period == 0
    sites = {s.name: s for s in allocation_sites(profile, Symbolizer())}
    assert sites["leak_records"].live_objects == 20 * 256 + 1  # the blocks, plus the array that holds them
    assert sites["churn_buffers"].live_bytes == 0 < sites["churn_buffers"].alloc_bytes
    assert sites["cache_fill"].live_bytes == 256 * 8192


@pytest.mark.native
@pytest.mark.skipif(shutil.which("jeprof") is None, reason="jeprof (libjemalloc-dev) not installed")
@pytest.mark.parametrize("kind", ["je_final", "tc_final"])
def test_the_top_site_agrees_with_jeprof(dumps, kind):
    out = subprocess.run(
        ["jeprof", "--text", str(dumps["binary"]), str(dumps[kind])],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    first = next(line for line in out.splitlines() if "%" in line).split()
    ours = allocation_sites(read_heap_profile(dumps[kind]), Symbolizer())[0]
    assert first[-1] == ours.name == "leak_records"
    assert math.isclose(float(first[0]) * 2**20, ours.live_bytes, rel_tol=0.02)


@pytest.mark.native
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_truncated_dumps_are_refused_or_complete(dumps, data):
    """Cut anywhere: an error naming the file, or (cut inside the maps, on a line end) the same stacks."""
    for kind in ("je_final", "tc_final"):
        raw = dumps[kind].read_bytes()
        whole = parse_heap_profile(raw, kind)
        cut = data.draw(st.integers(0, len(raw) - 1), label=kind)
        try:
            part = parse_heap_profile(raw[:cut], kind)
        except HeapProfileError as exc:
            assert kind in str(exc)
            assert "truncated" in str(exc) or "empty" in str(exc) or "expected" in str(exc)
        else:
            assert part.stacks == whole.stacks
            assert raw[:cut].endswith(b"\n") and cut > raw.index(MAPS_MARKER.encode())


@pytest.mark.native
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.floats(0, 1, exclude_max=True), junk=st.binary(min_size=1, max_size=8))
def test_corrupted_dumps_raise_clear_errors(dumps, position, junk):
    raw = dumps["je_final"].read_bytes()
    at = int(position * len(raw))
    corrupt = raw[:at] + junk + raw[at + len(junk) :]
    try:
        parse_heap_profile(corrupt, "corrupt.heap")
    except HeapProfileError as exc:
        assert str(exc).startswith("corrupt.heap")
        assert isinstance(exc, ProbeError)


# ------------------------------------------------------------------------------------------ generated
def _jemalloc_text(period: int, stacks: list[tuple[list[int], int, int]]) -> str:
    objects, size = sum(s[1] for s in stacks), sum(s[2] for s in stacks)
    lines = [f"heap_v2/{period}", f"  t*: {objects}: {size} [0: 0]", f"  t0: {objects}: {size} [0: 0]"]
    for frames, n, b in stacks:
        lines.append("@ " + " ".join(f"0x{f:x}" for f in frames))
        lines += [f"  t*: {n}: {b} [0: 0]", f"  t0: {n}: {b} [0: 0]", "  t1: 0: 0 [0: 0]"]
    return "\n".join(lines) + "\n\n" + MAPS_MARKER + "\n" + MAPS


def _gperftools_text(stacks: list[tuple[list[int], int, int]]) -> str:
    objects, size = sum(s[1] for s in stacks), sum(s[2] for s in stacks)
    lines = [f"heap profile: {objects:6d}: {size:8d} [{objects:6d}: {size:8d}] @ heapprofile"]
    lines += [
        f"{n:6d}: {b:8d} [{n:6d}: {b:8d}] @ " + " ".join(f"0x{f:x}" for f in frames)
        for frames, n, b in stacks
    ]
    return "\n".join(lines) + "\n\n" + MAPS_MARKER + "\n" + MAPS


stack_lists = st.lists(
    st.tuples(
        st.lists(st.integers(1, 2**64 - 1), min_size=1, max_size=12),
        st.integers(0, 10**6),
        st.integers(0, 10**12),
    ),
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(stacks=stack_lists)
def test_generated_profiles_round_trip(stacks):
    exact = _gperftools_text(stacks)
    profile = parse_heap_profile(exact, "gen.heap")
    assert [(list(s.frames), s.live_objects, s.live_bytes) for s in profile.stacks] == [
        (f, float(n), float(b)) for f, n, b in stacks
    ]
    sampled = parse_heap_profile(_jemalloc_text(1, stacks), "gen.heap")  # period 1: nothing to un-bias
    assert [s.live_bytes for s in sampled.stacks] == [float(b) for _, _, b in stacks]
    assert profile.mappings[0].path == "/opt/app/server"


@settings(max_examples=200, deadline=None)
@given(stacks=stack_lists, period=st.integers(0, 2**20), blank=st.booleans())
def test_the_fast_path_reads_what_the_line_parser_reads(stacks, period, blank):
    text = _jemalloc_text(period, stacks)
    if not blank:
        text = text.replace("\n\n" + MAPS_MARKER, "\n" + MAPS_MARKER)
    body = text[: text.index(MAPS_MARKER)].rstrip("\n") + ("\n" if blank else "")
    fast = heapprofile._fast_jemalloc(body, "gen.heap")
    assert fast is not None
    assert fast == heapprofile._parse_jemalloc(body.split("\n"), "gen.heap")


@pytest.mark.native
def test_the_fast_path_on_real_dumps(dumps):
    for path in dumps["je_final"].parent.glob("*.heap"):
        text = path.read_text()
        body = text[: text.index("\n" + MAPS_MARKER)]
        fast = heapprofile._fast_jemalloc(body, path.name)
        assert fast is not None and fast == heapprofile._parse_jemalloc(body.split("\n"), path.name)


@settings(max_examples=100, deadline=None)
@given(objects=st.integers(1, 10**6), average=st.integers(1, 2**24), period=st.integers(2, 2**20))
def test_unbiasing_scales_up_and_never_down(objects, average, period):
    text = _jemalloc_text(period, [([0x1234], objects, objects * average)])
    record = parse_heap_profile(text).stacks[0]
    assert record.live_bytes >= objects * average
    assert math.isfinite(record.live_bytes)
    scale = 1 / (1 - math.exp(-average / period))
    assert math.isclose(record.live_bytes, objects * average * scale, rel_tol=1e-9)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=400))
def test_arbitrary_text_is_a_profile_or_a_clear_error(text):
    try:
        parse_heap_profile(text, "x.heap")
    except HeapProfileError as exc:
        assert str(exc).startswith("x.heap")


@settings(max_examples=200, deadline=None)
@given(stacks=stack_lists, line=st.text(min_size=1, max_size=40).filter(lambda s: "\n" not in s))
def test_an_odd_line_in_the_stacks_is_refused(stacks, line):
    text = _gperftools_text(stacks)
    head, _, tail = text.partition("\n")
    try:
        parse_heap_profile(head + "\n" + line + "\n" + tail, "odd.heap")
    except HeapProfileError as exc:
        assert "odd.heap:2" in str(exc)


wide = st.one_of(st.integers(0, 2**64 - 1), st.integers(2**64 - 2, 2**64 + 2), st.integers(0, 10**400))


@settings(max_examples=300, deadline=None)
@given(objects=wide, size=wide, period=wide, gperftools=st.booleans())
def test_counts_past_64_bits_are_refused_naming_their_line(objects, size, period, gperftools):
    """Every figure of a dump is a 64-bit counter: a wider one is corruption (and would overflow a
    float while un-biasing), refused with the line; the rest parse to finite figures."""
    if gperftools:
        text = _gperftools_text([([0x1234], objects, size)]).replace("heapprofile", f"heap_v2/{period}", 1)
    else:
        text = _jemalloc_text(period, [([0x1234], objects, size)])
    try:
        profile = parse_heap_profile(text, "wide.heap")
    except HeapProfileError as exc:
        assert max(objects, size, period) >= 2**64, exc
        assert re.match(r"wide\.heap:\d+: a count, size or sample period wider than 64 bits", str(exc)), exc
    else:
        assert max(objects, size, period) < 2**64
        (record,) = profile.stacks
        assert math.isfinite(record.live_bytes) and math.isfinite(record.live_objects)
        assert record.live_bytes >= float(size)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "empty file"),
        ("heap_v2/524288\n  t*: 1: 2 [0: 0]\n", "no MAPPED_LIBRARIES"),
        ("heap_v2/524288\n  t*: 1: 2 [0: 0]\n@ 0x1\n\nMAPPED_LIBRARIES:\n", "counts"),
        ("heap_v2/524288\n  t*: 1: 2 [0: 0]\n@ 0x1\n  t*: 1: 2 [0: 0]", "no newline"),
        ("--- heapz 1 ---\n", "not a heap profile"),
        ("heap profile: 1: 2 [3: 4] @ growthz\n\nMAPPED_LIBRARIES:\n", "not supported"),
        (f"heap_v2/1\n  t*: 0: 0 [0: 0]\n@ 0x{2**64:x}\n  t*: 1: 1 [0: 0]\n\nMAPPED_LIBRARIES:\n", "64 bits"),
        ("heap_v2/1\n  t*: 0: 0 [0: 0]\n\nMAPPED_LIBRARIES:\nnot a maps line\n", "/proc/PID/maps"),
    ],
)
def test_bad_files_name_the_problem(text, expected):
    with pytest.raises(HeapProfileError, match=expected):
        parse_heap_profile(text, "bad.heap")


def test_files_that_cannot_be_read_or_are_too_large(tmp_path, monkeypatch):
    with pytest.raises(HeapProfileError, match="cannot read heap profile"):
        read_heap_profile(tmp_path / "missing.heap")
    big = tmp_path / "big.heap"
    big.write_text(_gperftools_text([([1], 1, 1)]))
    monkeypatch.setattr("native_hooks.heapprofile.MAX_PROFILE_BYTES", 10)
    with pytest.raises(HeapProfileError, match="larger than"):
        read_heap_profile(big)
    binary = tmp_path / "bin.heap"
    binary.write_bytes(b"heap_v2/1\n\xff\xfe")
    monkeypatch.setattr("native_hooks.heapprofile.MAX_PROFILE_BYTES", 2**20)
    with pytest.raises(HeapProfileError, match="not text"):
        read_heap_profile(binary)


def test_maps_lines():
    line = (
        "7f70fe009000-7f70fe0af000 r-xp 00009000 fe:00 5595219   /usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    )
    mapping = parse_maps_line(line)
    assert mapping is not None and mapping.executable and mapping.offset == 0x9000
    assert mapping.path.endswith("libjemalloc.so.2")
    assert parse_maps_line("7f70fe009000-7f70fe0af000 rw-p 00000000 00:00 0 ").path == ""
    assert parse_maps_line("7f7-7f6 rw-p 00000000 00:00 0") is None  # end before start
    assert parse_maps_line("garbage") is None
    with_space = parse_maps_line("1000-2000 r-xp 0 08:01 7   /opt/my app/lib.so (deleted)")
    assert with_space is not None and with_space.path == "/opt/my app/lib.so (deleted)"


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_profile_path_that_is_a_fifo_or_a_device_is_refused_without_waiting(tmp_path, kind):
    import os

    from native_hooks.heapprofile import HeapProfileError, read_heap_profile

    path = tmp_path / "jeprof.1.0.heap"
    if kind == "fifo":
        os.mkfifo(path)  # no writer: reading it would wait for ever
    else:
        path = Path("/dev/zero")
    with pytest.raises(HeapProfileError, match="not a regular file"):
        read_heap_profile(path)
