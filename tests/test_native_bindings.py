"""The ctypes bindings against Debian's real allocators: each check runs in a child Python started with
the allocator in LD_PRELOAD (jemalloc cannot be loaded into a running process)."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from medic_hook.glibc import MALLINFO2_FIELDS
from support.workloads import python_argv, target_env

pytestmark = pytest.mark.native

PRELUDE = """
import errno, json, os, sys
from medic_hook import jemalloc, tcmalloc, glibc
from medic_hook.allocator import local_allocator, malloc_owner
from medic_hook.errors import AllocatorError, MallctlError
out = {}
def fails(fn, *args):
    try:
        fn(*args)
    except MallctlError as exc:
        return {"type": "MallctlError", "errno": exc.errno, "name": exc.name, "message": str(exc)}
    except AllocatorError as exc:
        return {"type": "AllocatorError", "message": str(exc)}
    return None
"""


def run_under(allocator: str, code: str, **env: str) -> dict:
    """Run `code` (which fills `out`) in a child under `allocator`; returns `out`."""
    script = PRELUDE + textwrap.dedent(code) + "\nprint(json.dumps(out))\n"
    result = subprocess.run(
        [python_argv()[0], "-c", script],
        env=target_env(allocator, extra=env),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


# -- jemalloc --------------------------------------------------------------------------------------
def test_mallctl_reads_every_type() -> None:
    out = run_under(
        "jemalloc",
        """
        m = jemalloc.require_jemalloc()
        out["version"] = m.version()
        out["config.prof"] = m.read_bool("config.prof")
        out["narenas"] = m.read_unsigned("arenas.narenas")
        out["page"] = m.read_size_t("arenas.page")
        out["dirty_decay_ms"] = m.read_ssize_t("opt.dirty_decay_ms")
        out["epoch"] = m.read_uint64("epoch")
        out["prefix"] = m.read_str("opt.prof_prefix")
        out["refresh"] = m.refresh()
        out["stats"] = m.stats()
        out["arenas"] = m.arena_stats()
        out["options"] = m.options()
        m.purge()
        out["allocator"] = local_allocator().name
        out["owner"] = malloc_owner()
        """,
    )
    assert out["version"].startswith("5.")
    assert out["config.prof"] is True
    assert out["narenas"] >= 1 and out["page"] == 4096
    assert out["dirty_decay_ms"] == 10000
    assert out["epoch"] >= 1 and out["refresh"] >= 1
    assert out["prefix"] == "jeprof"
    assert {"allocated", "active", "metadata", "resident", "mapped", "retained", "dirty", "muzzy"} <= set(
        out["stats"]
    )
    assert out["stats"]["allocated"] <= out["stats"]["active"] <= out["stats"]["resident"]
    assert out["arenas"] and {"arena", "active", "dirty", "muzzy"} <= set(out["arenas"][0])
    assert out["options"]["opt.prof"] is False and "opt.narenas" in out["options"]
    assert out["allocator"] == "jemalloc" and "libjemalloc" in out["owner"]


def test_mallctl_errors_say_what_to_do() -> None:
    out = run_under(
        "jemalloc",
        """
        m = jemalloc.require_jemalloc()
        out["unknown"] = fails(m.read_size_t, "no.such.control")
        out["wrong_size"] = fails(m.read_size_t, "opt.prof")
        out["read_only"] = fails(m.write_size_t, "stats.allocated", 1)
        out["no_prof_dump"] = fails(m.prof_dump, "/tmp/never.heap")
        out["no_prof_reset"] = fails(m.prof_reset)
        out["enabled"] = m.prof_enabled()
        """,
    )
    assert out["unknown"]["errno"] == 2 and "no such control" in out["unknown"]["message"]
    assert out["wrong_size"]["errno"] == 22 and "wrong size" in out["wrong_size"]["message"]
    assert out["read_only"]["errno"] == 1 and "read-only" in out["read_only"]["message"]
    assert out["no_prof_dump"]["name"] == "prof.dump"
    assert "MALLOC_CONF=prof:true" in out["no_prof_dump"]["message"]
    assert "MALLOC_CONF=prof:true" in out["no_prof_reset"]["message"]
    assert out["enabled"] is False


def test_mallctl_heap_profiling(tmp_path) -> None:
    out = run_under(
        "jemalloc",
        f"""
        m = jemalloc.require_jemalloc()
        out["enabled"] = m.prof_enabled()
        out["was_active"] = m.prof_active(True)
        out["now_active"] = m.read_bool("prof.active")
        keep = [bytearray(1 << 20) for _ in range(8)]
        m.prof_dump({str(tmp_path / "a.heap")!r})
        m.prof_reset()
        m.prof_reset(12)
        out["lg_sample"] = m.read_size_t("prof.lg_sample")
        out["missing_dir"] = fails(m.prof_dump, {str(tmp_path / "no" / "b.heap")!r})
        """,
        MALLOC_CONF="prof:true,prof_active:false",
    )
    assert out["enabled"] is True and out["was_active"] is False and out["now_active"] is True
    assert (tmp_path / "a.heap").read_bytes().startswith(b"heap_v2/")
    assert out["lg_sample"] == 12
    assert out["missing_dir"]["errno"] == 14 and "directory must exist" in out["missing_dir"]["message"]


def test_jemalloc_missing_says_how_to_load_it() -> None:
    out = run_under(
        "glibc",
        'out["error"] = fails(jemalloc.require_jemalloc)\nout["found"] = jemalloc.Mallctl.find() is None',
    )
    assert "LD_PRELOAD=libjemalloc.so.2" in out["error"]["message"] and out["found"] is True


# -- tcmalloc --------------------------------------------------------------------------------------
def test_tcmalloc_properties_release_and_heap_profiler(tmp_path) -> None:
    out = run_under(
        "tcmalloc",
        f"""
        tc = tcmalloc.require_tcmalloc()
        out["props"] = tc.properties()
        out["unknown"] = tc.property("no.such.property")
        keep = [bytearray(1023) for _ in range(100000)]
        del keep[::2]
        before = tc.property("tcmalloc.pageheap_free_bytes")
        tc.release_free_memory()
        out["released"] = [before, tc.property("tcmalloc.pageheap_unmapped_bytes")]
        out["text"] = tc.stats_text()[:2000]
        out["has"] = tc.has_heap_profiler
        tc.heap_profiler_start({str(tmp_path / "hp")!r})
        out["running"] = tc.heap_profiler_running()
        more = [bytearray(1 << 20) for _ in range(4)]
        out["profile"] = tc.heap_profile()[:40].decode()
        tc.heap_profiler_dump("medic test")
        tc.heap_profiler_stop()
        out["stopped"] = not tc.heap_profiler_running()
        out["allocator"] = local_allocator().name
        """,
    )
    assert {"generic.current_allocated_bytes", "generic.heap_size", "tcmalloc.pageheap_free_bytes"} <= set(
        out["props"]
    )
    assert out["unknown"] is None
    assert out["released"][1] > 0
    assert "MALLOC:" in out["text"]
    assert out["has"] and out["running"] and out["stopped"]
    assert out["profile"].startswith("heap profile:")
    assert list(tmp_path.glob("hp.*.heap"))
    assert out["allocator"] == "tcmalloc"


def test_tcmalloc_minimal_has_no_heap_profiler() -> None:
    out = run_under(
        "tcmalloc_minimal",
        'tc = tcmalloc.require_tcmalloc()\nout["has"] = tc.has_heap_profiler\nout["error"] = fails(tc.heap_profile)',
    )
    assert out["has"] is False
    assert "libtcmalloc.so.4" in out["error"]["message"]


# -- glibc -----------------------------------------------------------------------------------------
def test_glibc_mallinfo2_trim_and_malloc_info() -> None:
    out = run_under(
        "glibc",
        """
        g = glibc.require_glibc()
        blocks = [bytearray(1023) for _ in range(100000)]
        del blocks[1::64]
        kept = blocks[::64]
        del blocks
        out["info"] = g.mallinfo2()
        out["parsed"] = glibc.parse_malloc_info(g.info_xml()).to_dict()
        out["trimmed"] = g.trim(0)
        out["allocator"] = local_allocator().name
        out["tc"] = tcmalloc.Tcmalloc.find() is None
        """,
    )
    assert set(out["info"]) == set(MALLINFO2_FIELDS)
    assert out["info"]["fordblks"] > 50 * 2**20
    assert out["parsed"]["free_bytes"] > 50 * 2**20 and out["parsed"]["heaps"] >= 1
    assert out["parsed"]["trimmable_bytes"] > 20 * 2**20
    assert out["trimmed"] is True
    assert out["allocator"] == "glibc" and out["tc"] is True
