"""Property and fuzz tests of every parser on the native side: malloc_info XML, /proc/PID/maps and
environ, the hook protocol's request/reply lines, socket templates, and stats replies -> samples."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.core.catalog import CATALOG
from agent.core.errors import ProbeError
from medic_hook.allocator import glibc_figures, jemalloc_figures, tcmalloc_figures
from medic_hook.errors import AllocatorError
from medic_hook.glibc import MALLINFO2_FIELDS, GlibcMalloc, parse_malloc_info
from native_hooks import protocol
from native_hooks.errors import HookProtocolError
from native_hooks.sockets import SocketPathError, expand, has_pid
from native_hooks.which_allocator import mapped_files
from probes.allocator import samples_from_stats
from probes.linux.maps import parse_maps
from probes.linux.procfs import parse_environ

# -- malloc_info -----------------------------------------------------------------------------------
REAL_SNIPPET = """<malloc version="1">
<heap nr="0">
<sizes>
  <size from="33" to="33" total="264" count="8"/>
  <size from="8193" to="16384" total="5242880" count="400"/>
  <unsorted from="209" to="65536" total="1048576" count="20"/>
</sizes>
<total type="fast" count="2" size="96"/>
<total type="rest" count="62595" size="195206146"/>
<system type="current" size="210075648"/>
<system type="max" size="210075648"/>
<aspace type="total" size="210075648"/>
<aspace type="mprotect" size="210075648"/>
</heap>
<total type="fast" count="2" size="96"/>
<total type="rest" count="62595" size="195206146"/>
<total type="mmap" count="4" size="9060352"/>
<system type="current" size="210075648"/>
<system type="max" size="210075648"/>
<aspace type="total" size="210075648"/>
<aspace type="mprotect" size="210075648"/>
</malloc>
"""


def test_malloc_info_of_a_real_heap() -> None:
    info = parse_malloc_info(REAL_SNIPPET)
    assert len(info.heaps) == 1 and info.heaps[0].rest_count == 62595
    assert info.mmap_count == 4 and info.mmap_bytes == 9060352
    assert info.system_current == 210075648
    # 8 KiB-16 KiB chunks hold at least total - 2 pages each; smaller (or possibly smaller) chunks count 0
    assert info.trimmable_bytes() == 5242880 - 400 * 2 * 4096
    assert info.to_dict()["free_bytes"] == 195206146 + 96


def test_malloc_info_from_this_process() -> None:
    glibc = GlibcMalloc.find()
    assert glibc is not None
    info = parse_malloc_info(glibc.info_xml())
    assert info.heaps and info.system_current > 0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "not well formed"),
        ("<malloc>", "not well formed"),
        ("<heap nr='0'/>", "root element is <heap>"),
        ('<malloc><heap nr="x"/></malloc>', "expected an integer"),
        ("<malloc><heap/></malloc>", "no 'nr' attribute"),
        ('<malloc><total type="rest" count="-1" size="0"/></malloc>', "negative"),
        ('<!DOCTYPE x [<!ENTITY a "b">]><malloc/>', "document type"),
    ],
)
def test_malloc_info_errors_name_the_fault(text: str, fragment: str) -> None:
    with pytest.raises(AllocatorError, match=fragment):
        parse_malloc_info(text)


@given(st.text(max_size=300) | st.binary(max_size=300))
def test_malloc_info_never_raises_anything_else(data: str | bytes) -> None:
    try:
        parse_malloc_info(data)
    except AllocatorError:
        pass


buckets = st.lists(
    st.tuples(st.integers(0, 2**24), st.integers(0, 2**24), st.integers(0, 2**30), st.integers(0, 2**16)),
    max_size=6,
)


@given(st.lists(buckets, min_size=1, max_size=4), st.integers(0, 2**40), st.integers(0, 2**20))
def test_malloc_info_round_trip(heaps: list, mmap_bytes: int, mmap_count: int) -> None:
    parts = ['<malloc version="1">']
    for nr, rows in enumerate(heaps):
        parts.append(f'<heap nr="{nr}"><sizes>')
        parts += [f'<size from="{a}" to="{b}" total="{t}" count="{c}"/>' for a, b, t, c in rows]
        parts.append('</sizes><total type="rest" count="1" size="2"/></heap>')
    parts.append(f'<total type="mmap" count="{mmap_count}" size="{mmap_bytes}"/></malloc>')
    info = parse_malloc_info("".join(parts))
    assert [[(b.low, b.high, b.total, b.count) for b in h.buckets] for h in info.heaps] == heaps
    assert (info.mmap_count, info.mmap_bytes) == (mmap_count, mmap_bytes)
    bound = info.trimmable_bytes()
    assert 0 <= bound <= sum(t for rows in heaps for _, _, t, _ in rows)


# -- /proc/PID/maps and environ --------------------------------------------------------------------
def test_maps_of_this_process() -> None:
    with open("/proc/self/maps", "rb") as f:
        mappings = parse_maps(f.read())
    files = mapped_files(mappings)
    assert any("libc.so" in path for path in files)
    assert all(m.start < m.end for m in mappings)


def test_maps_error_names_the_line() -> None:
    with pytest.raises(ProbeError, match="line 2"):
        parse_maps(b"00400000-00401000 r-xp 00000000 fe:00 123 /bin/x\nnonsense\n")


maps_line = st.builds(
    lambda start, length, perms, offset, inode, path: (
        f"{start:x}-{start + length:x} {perms} {offset:08x} fe:00 {inode} {path}".rstrip()
    ),
    st.integers(0, 2**47),
    st.integers(1, 2**30),
    st.sampled_from(["r--p", "r-xp", "rw-p", "---p", "rw-s"]),
    st.integers(0, 2**32),
    st.integers(0, 2**32),
    st.sampled_from(
        ["", "[heap]", "[stack]", "/usr/lib/libc.so.6", "/tmp/a b (deleted)", "/x/libjemalloc.so.2"]
    ),
)


@given(st.lists(maps_line, max_size=20))
def test_maps_round_trip(lines: list[str]) -> None:
    mappings = parse_maps("\n".join(lines).encode())
    assert len(mappings) == len(lines)
    for path in mapped_files(mappings):
        assert path.startswith("/") and not path.endswith("(deleted)")


@given(st.text(max_size=400))
def test_maps_parser_only_raises_probe_error(text: str) -> None:
    try:
        parse_maps(text.encode("utf-8", "surrogatepass"))
    except ProbeError:
        pass


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=10).filter(lambda k: "=" not in k and "\x00" not in k),
        st.text(max_size=20).filter(lambda v: "\x00" not in v),
        max_size=8,
    )
)
def test_environ_round_trip(env: dict[str, str]) -> None:
    raw = b"".join(os.fsencode(f"{k}={v}") + b"\x00" for k, v in env.items())
    assert parse_environ(raw) == env


@given(st.binary(max_size=300))
def test_environ_never_raises(raw: bytes) -> None:
    assert isinstance(parse_environ(raw), dict)


# -- protocol --------------------------------------------------------------------------------------
@given(st.binary(max_size=600))
def test_decode_request_accepts_objects_with_a_string_op_or_raises_request_error(line: bytes) -> None:
    try:
        request = protocol.decode_request(line)
    except protocol.RequestError as exc:
        assert exc.code in protocol.ERROR_CODES
    else:
        assert isinstance(request["op"], str)


@given(
    st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=10), max_size=5),
    st.text(max_size=20),
)
def test_request_round_trip(extra: dict, op: str) -> None:
    line = protocol.encode({**extra, "op": op})
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and line.isascii()
    if len(line) < protocol.MAX_REQUEST_BYTES:
        assert protocol.decode_request(line[:-1])["op"] == op


def test_decode_request_limits() -> None:
    with pytest.raises(protocol.RequestError, match="longer than"):
        protocol.decode_request(b'{"op":"' + b"x" * 5000 + b'"}')
    with pytest.raises(protocol.RequestError, match="JSON object"):
        protocol.decode_request(b"[]")
    with pytest.raises(protocol.RequestError, match=r"not valid JSON|not one JSON"):
        protocol.decode_request(b'{"op": "ping", "x": NaN}')
    with pytest.raises(protocol.RequestError, match='needs "op"'):
        protocol.decode_request(b'{"op": 1}')


def test_encode_turns_non_finite_floats_into_null() -> None:
    assert json.loads(protocol.encode({"a": float("inf"), "b": [float("nan")]})) == {"a": None, "b": [None]}


@given(st.binary(max_size=300))
def test_decode_reply_only_raises_protocol_error(line: bytes) -> None:
    try:
        reply = protocol.decode_reply(line, "/x.sock")
    except HookProtocolError:
        return
    assert isinstance(reply["ok"], bool)


# -- socket templates ------------------------------------------------------------------------------
@given(st.text(alphabet="abc/%p._-", max_size=60), st.integers(1, 4_000_000))
def test_expand_replaces_pid_and_percent(template: str, pid: int) -> None:
    try:
        path = expand("/" + template, pid, 1000, {})
    except SocketPathError:
        return
    assert "%p" not in path.replace("%%", "") or "%%p" in template
    if "%" not in template:
        assert path == "/" + template


def test_expand_rules() -> None:
    assert expand("/run/x.%p.sock", 42, 0, {}) == "/run/x.42.sock"
    assert expand("/run/100%%.%p", 7, 0, {}) == "/run/100%.7"
    assert expand("auto", 42, 0, {}) == "/run/medic/hook.42.sock"
    assert (
        expand(" auto ", 42, 1000, {"XDG_RUNTIME_DIR": "/run/user/1000"})
        == "/run/user/1000/medic/hook.42.sock"
    )
    assert expand("auto", 42, 1000, {}) == "/tmp/medic-1000/hook.42.sock"
    assert expand("auto", 42, 0, {"MEDIC_HOOK_DIR": "/srv/h"}) == "/srv/h/hook.42.sock"
    assert has_pid("auto") and has_pid("/a.%p") and not has_pid("/a.%%p") and not has_pid("/a.sock")
    for bad, fragment in (("", "empty"), ("rel.sock", "absolute"), ("/" + "x" * 120, "longer than 107")):
        with pytest.raises(SocketPathError, match=fragment):
            expand(bad, 1, 0, {})


# -- figures and samples ---------------------------------------------------------------------------
sizes = st.integers(0, 2**44)


@given(
    st.fixed_dictionaries(
        {
            k: sizes
            for k in ("allocated", "active", "metadata", "resident", "mapped", "retained", "dirty", "muzzy")
        }
    )
)
def test_jemalloc_figures(native: dict[str, int]) -> None:
    figures = jemalloc_figures(native)
    assert figures["purgeable"] == native["dirty"] + native["muzzy"]
    assert all(v >= 0 for v in figures.values())


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "generic.current_allocated_bytes",
                "generic.heap_size",
                "generic.total_physical_bytes",
                "tcmalloc.pageheap_free_bytes",
                "tcmalloc.pageheap_unmapped_bytes",
                "tcmalloc.central_cache_free_bytes",
            ]
        ),
        sizes,
    )
)
def test_tcmalloc_figures_are_never_negative(props: dict[str, int]) -> None:
    figures = tcmalloc_figures(props)
    assert set(figures) == {
        "allocated",
        "active",
        "resident",
        "mapped",
        "retained",
        "metadata",
        "free",
        "purgeable",
    }
    assert all(v >= 0 for v in figures.values())


@given(st.fixed_dictionaries({k: sizes for k in MALLINFO2_FIELDS}), st.none() | sizes)
def test_glibc_resident_is_bounded_by_rss(info: dict[str, int], rss: int | None) -> None:
    figures = glibc_figures(info, rss)
    assert figures["resident"] <= figures["mapped"]
    if rss:
        assert figures["resident"] <= rss


json_any = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.sampled_from(["figures", "python", "pid", "ok"]), json_any, max_size=4))
def test_samples_from_any_reply_never_raise_and_use_catalog_names(reply: dict) -> None:
    for sample in samples_from_stats("i", 1.0, reply):
        assert sample.metric in CATALOG and CATALOG[sample.metric].source == "allocator"


def test_samples_from_a_real_shape() -> None:
    reply = {
        "figures": {"allocated": 100, "resident": 400, "mapped": 500, "purgeable": 7},
        "python": {"pymalloc_allocated_blocks": 9},
    }
    values = {s.metric: s.value for s in samples_from_stats("api", 5.0, reply)}
    assert values == {
        "allocator_allocated_bytes": 100.0,
        "allocator_resident_bytes": 400.0,
        "allocator_mapped_bytes": 500.0,
        "allocator_purgeable_bytes": 7.0,
        "allocator_fragmentation_ratio": 4.0,
        "pymalloc_allocated_blocks": 9.0,
    }
