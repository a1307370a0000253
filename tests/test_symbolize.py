"""Symbolization against real processes: a C program and a C++ program print the addresses of their own
functions; medic must name them from /proc/PID/maps and the ELF files, demangle C++, and never raise."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.errors import TargetGone
from native_hooks.symbolize import Symbolizer
from probes.linux.maps import Mapping, read_maps
from support.histo import clean_env, read_ready
from support.procs import SpawnFn

pytestmark = pytest.mark.native

C_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((noinline)) int alpha(int x) { return x * 3 + 1; }
__attribute__((noinline)) static int beta_local(int x) { return alpha(x) + 7; }
int main(void) {
    printf("ready %d %p %p %p\n", getpid(), (void *)alpha, (void *)beta_local, (void *)malloc);
    fflush(stdout);
    pause();
    return beta_local(1);
}
"""

CXX_SOURCE = r"""
#include <cstdio>
#include <unistd.h>
namespace ranker {
struct Featurizer {
    __attribute__((noinline)) static long featurize(long rows, double scale) { return (long)(rows * scale); }
};
template <typename T> __attribute__((noinline)) T twice(T value) { return value + value; }
}
int main() {
    long (*f)(long, double) = &ranker::Featurizer::featurize;
    int (*t)(int) = &ranker::twice<int>;
    std::printf("ready %d %p %p\n", getpid(), (void *)f, (void *)t);
    std::fflush(stdout);
    pause();
    return (int)f(1, 2.0) + t(1);
}
"""


def _compile(tmp_path: Path, name: str, source: str, compiler: str) -> str:
    suffix = ".cc" if compiler == "c++" else ".c"
    path = tmp_path / f"{name}{suffix}"
    path.write_text(source)
    binary = tmp_path / name
    subprocess.run(
        [compiler, "-O1", "-g", "-o", str(binary), str(path)], check=True, capture_output=True, timeout=120
    )
    return str(binary)


def _start(spawn: SpawnFn, binary: str) -> tuple[int, list[int]]:
    proc = spawn([binary], stdout=subprocess.PIPE, text=True, env=clean_env())
    words = read_ready(proc)
    return int(words[1]), [int(w, 16) for w in words[2:]]


def test_c_functions_are_named_from_the_live_process(spawn, tmp_path):
    pid, (alpha, beta, malloc) = _start(spawn, _compile(tmp_path, "prog", C_SOURCE, "cc"))
    maps = read_maps(pid)
    symbolizer = Symbolizer()
    frames = symbolizer.symbolize([alpha, alpha + 3, beta + 1, malloc, 0x10], maps)
    assert frames[alpha].function == "alpha" and frames[alpha].known
    assert frames[alpha + 3].function == "alpha"  # inside the function, not at its start
    assert frames[beta + 1].function == "beta_local"  # a local symbol, from .symtab
    assert frames[malloc].function in ("malloc", "__libc_malloc")  # libc: .dynsym or its debug file
    assert frames[malloc].object.endswith("libc.so.6")
    assert not frames[0x10].known and frames[0x10].function == "0x10"


def test_symbolizing_through_the_process_root_gives_the_same_names(spawn, tmp_path):
    pid, (alpha, _beta, _malloc) = _start(spawn, _compile(tmp_path, "prog", C_SOURCE, "cc"))
    frames = Symbolizer(root=f"/proc/{pid}/root").symbolize([alpha], read_maps(pid))
    assert frames[alpha].function == "alpha"


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_cpp_names_are_demangled(spawn, tmp_path):
    pid, (featurize, twice) = _start(spawn, _compile(tmp_path, "cxx", CXX_SOURCE, "c++"))
    symbolizer = Symbolizer()
    frames = symbolizer.symbolize([featurize, twice], read_maps(pid))
    if symbolizer.demangler:
        assert frames[featurize].function == "ranker::Featurizer::featurize(long, double)"
        assert frames[twice].function == "int ranker::twice<int>(int)"
    raw = Symbolizer(demangle=False).symbolize([featurize], read_maps(pid))
    assert raw[featurize].function == "_ZN6ranker10Featurizer9featurizeEld"


def test_addresses_outside_sized_symbols_name_the_object(tmp_path):
    """A stripped object (or a non-ELF file) gives `object+0xoffset`, never a wrong neighbour."""
    blob = tmp_path / "libblob.so"
    blob.write_bytes(b"\0" * 8192)
    binary = _compile(tmp_path, "prog", C_SOURCE, "cc")
    stripped = tmp_path / "stripped"
    shutil.copy(binary, stripped)
    subprocess.run(["strip", str(stripped)], check=True)
    maps = [
        Mapping(0x1000, 0x3000, "r-xp", 0x0, str(blob)),
        Mapping(0x10000, 0x20000, "r-xp", 0x1000, str(stripped)),
    ]
    frames = Symbolizer().symbolize([0x1800, 0x10100], maps)
    assert frames[0x1800].function == "libblob.so+0x800" and not frames[0x1800].known
    assert frames[0x10100].function.startswith("stripped+0x")


def test_symbol_tables_are_read_once_and_again_after_a_rebuild(tmp_path):
    binary = _compile(tmp_path, "prog", C_SOURCE, "cc")
    symbolizer = Symbolizer()
    first = symbolizer.object_symbols(binary)
    assert first is not None and "alpha" in first.names
    assert symbolizer.object_symbols(binary) is first
    os.utime(binary, ns=(1, 1))  # what a rebuild changes
    assert symbolizer.object_symbols(binary) is not first
    assert symbolizer.object_symbols(str(tmp_path / "missing")) is None


def test_a_gone_process_has_no_maps():
    with pytest.raises(TargetGone):
        read_maps(2**22 + 12345)


@settings(max_examples=200, deadline=None)
@given(
    addresses=st.lists(st.integers(0, 2**64 - 1), max_size=20),
    maps=st.lists(
        st.tuples(
            st.integers(0, 2**48),
            st.integers(1, 2**20),
            st.integers(0, 2**32),
            st.sampled_from(
                [
                    "/usr/lib/x86_64-linux-gnu/libc.so.6",
                    "/nonexistent/lib.so",
                    "",
                    "[heap]",
                    "/etc/hostname",
                    "/bin/sh",
                ]
            ),
        ),
        max_size=6,
    ),
)
def test_any_address_with_any_map_gets_a_frame(addresses, maps):
    mappings = [Mapping(start, start + size, "r-xp", offset, path) for start, size, offset, path in maps]
    frames = Symbolizer(demangle=False).symbolize(addresses, mappings)
    assert set(frames) == set(addresses)
    assert all(frame.function for frame in frames.values())
