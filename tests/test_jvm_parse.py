"""jcmd output parsers on outputs captured from OpenJDK 17 and 25 (tests/fixtures/jvm), plus fuzzing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.errors import ProbeAccessDenied, ProbeError, ProbeUnavailable, TargetGone
from probes.jvmtext import (
    JcmdOutputError,
    attach_failure,
    parse_class_histogram,
    parse_heap_info,
    parse_native_memory,
    split_report,
)

FIXTURES = Path(__file__).parent / "fixtures" / "jvm"
K, M = 1024, 1024 * 1024


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("name", "collector", "used", "committed", "after_gc"),
    [
        ("heap_info_g1_17.txt", "G1", 10233 * K, 65536 * K, 10233 * K - (10240 - 1024) * K),
        ("heap_info_g1_25.txt", "G1", 3278 * K, 65536 * K, 3278 * K - (3072 - 2048) * K),
        ("heap_info_parallel_17.txt", "Parallel", 16058 * K, (18944 + 44032) * K, 0),
        ("heap_info_serial_17.txt", "Serial", 16497 * K, (19648 + 43712) * K, 0),
        ("heap_info_z_17.txt", "Z", 4 * M, 64 * M, None),
        ("heap_info_z_25.txt", "Z", 6 * M, 64 * M, None),
        ("heap_info_shenandoah_17.txt", "Shenandoah", 15872 * K, 65536 * K, None),
    ],
)
def test_heap_info_of_every_collector(name, collector, used, committed, after_gc):
    """G1: after GC = used minus eden (young regions include the survivors); ZGC and Shenandoah have no
    generations to tell garbage from survivors (JDK 17 and 25)."""
    heap = parse_heap_info(fixture(name))
    assert (heap.collector, heap.used, heap.committed, heap.after_gc) == (
        collector,
        used,
        committed,
        after_gc,
    )
    if "_17" in name:
        assert (
            heap.metaspace_used
            and heap.metaspace_committed
            and heap.metaspace_used <= heap.metaspace_committed
        )


@pytest.mark.parametrize("name", ["heap_info_parallel_17.txt", "heap_info_serial_17.txt"])
def test_parallel_and_serial_after_gc_is_old_plus_survivors(name):
    text = fixture(name).replace("used 0K", "used 1000K").replace(" 0% used", " 50% used")
    heap = parse_heap_info(text)
    survivor = 2560 * K if "parallel" in name else 2176 * K
    assert heap.after_gc == 1000 * K + survivor // 2


@pytest.mark.parametrize("name", ["nmt_17.txt", "nmt_25.txt"])
def test_native_memory_summary(name):
    nmt = parse_native_memory(fixture(name))
    assert nmt is not None
    assert nmt.committed < nmt.reserved
    assert nmt.heap_committed == nmt.categories["Java Heap"][1]
    assert nmt.malloc and nmt.malloc < nmt.committed
    assert {"Java Heap", "Class", "Thread", "Code", "GC", "Metaspace"} <= set(nmt.categories)
    assert sum(c for _, c in nmt.categories.values()) == pytest.approx(nmt.committed, rel=0.01)


def test_native_memory_off_is_none_not_an_error():
    assert parse_native_memory("12345:\nNative memory tracking is not enabled\n") is None
    with pytest.raises(JcmdOutputError, match="not an NMT summary"):
        parse_native_memory("12345:\nsomething else\n")


@pytest.mark.parametrize("name", ["class_histogram_all_17.txt", "class_histogram_live_25.txt"])
def test_class_histograms(name):
    histogram = parse_class_histogram(fixture(name))
    assert histogram.bad_rows == 0
    assert len(histogram.rows) == int(fixture(name).splitlines()[-2].split(":")[0])  # the last rank
    assert sum(r.bytes for r in histogram.rows) == histogram.total_bytes
    assert sum(r.instances for r in histogram.rows) == histogram.total_instances
    names = {r.name: r for r in histogram.rows}
    assert names["[B"].module is not None and names["[B"].module.startswith("java.base@")
    assert any(r.name.startswith("Leak$") and r.module is None for r in histogram.rows)  # the app's classes


def test_combined_report_is_split_by_section():
    report = split_report(fixture("combined_17.txt"))
    assert parse_heap_info(report.heap_info).collector == "G1"
    assert parse_native_memory(report.native_memory).heap_committed == 64 * M
    assert len(parse_class_histogram(report.class_histogram).rows) > 200
    plain = split_report(fixture("combined_no_nmt_17.txt"))
    assert parse_native_memory(plain.native_memory) is None
    assert parse_class_histogram(plain.class_histogram).total_bytes > 0
    heap_only = split_report("4242:\n" + fixture("heap_info_g1_25.txt").split("\n", 1)[1])
    assert heap_only.class_histogram is None and heap_only.native_memory is None


def test_a_histogram_cut_short_is_refused():
    text = fixture("class_histogram_all_17.txt")
    lines = text.splitlines()
    with pytest.raises(JcmdOutputError, match="truncated class histogram"):
        parse_class_histogram("\n".join(lines[:100]))
    with pytest.raises(JcmdOutputError, match="no class histogram header"):
        parse_class_histogram("\n".join(lines[5:]))
    broken = "\n".join([*lines[:-1], "Total 12 x"])
    with pytest.raises(JcmdOutputError, match="expected 'Total"):
        parse_class_histogram(broken)


def test_odd_rows_are_skipped_and_counted_but_garbage_is_refused():
    lines = fixture("class_histogram_all_17.txt").splitlines()
    odd = [*lines[:10], "   9: not a row", *lines[10:]]
    histogram = parse_class_histogram("\n".join(odd))
    assert histogram.bad_rows == 1
    garbage = lines[:3] + ["nonsense"] * 50 + lines[-1:]
    with pytest.raises(JcmdOutputError, match="not histogram rows"):
        parse_class_histogram("\n".join(garbage))


@pytest.mark.parametrize(
    ("stem", "kind", "words"),
    [
        ("attach_disabled_17", ProbeUnavailable, "DisableAttachMechanism"),
        ("attach_other_user_17", ProbeAccessDenied, "as the JVM's user or as root"),
    ],
)
def test_attach_failures_say_what_to_do(stem, kind, words):
    error = attach_failure(4242, 1, fixture(f"{stem}.stdout"), fixture(f"{stem}.stderr"))
    assert type(error) is kind and words in str(error)


def test_other_attach_failures():
    assert isinstance(attach_failure(1, 1, "", "java.io.IOException: No such process\n\tat x"), TargetGone)
    hung = attach_failure(
        1, 1, "1:\n", "AttachNotSupportedException: Unable to open socket file /tmp/.java_pid1"
    )
    assert type(hung) is ProbeError and "did not answer" in str(hung)
    other = attach_failure(
        1, 3, "1:\n", "java.lang.IllegalArgumentException: Unknown diagnostic command\n\tat y"
    )
    assert "exit 3" in str(other) and "Unknown diagnostic command" in str(other)


# figures as jcmd prints them, and wider than any JVM counter (a Java long), up to 400 digits
figures = st.one_of(st.integers(0, 10**12), st.integers(2**63 - 2, 2**63 + 2), st.integers(0, 10**400))
units = st.sampled_from(["", "K", "M", "G", "KB", "MB", "GB"])
lines = st.one_of(
    st.text(max_size=60).map(lambda s: s.replace("\n", " ")),
    st.builds(
        lambda r, n, b, c: f"{r:4d}: {n:12d} {b:14d}  {c}",
        st.integers(0, 10**5),
        figures,
        figures,
        st.from_regex(r"[A-Za-z$.\[;]{1,30}", fullmatch=True),
    ),
    st.builds(lambda n, b: f"Total {n} {b}", figures, figures),
    st.builds(
        lambda t, tu, u, uu: f" garbage-first heap   total {t}{tu}, used {u}{uu} [0x0, 0x1)",
        figures,
        units,
        figures,
        units,
    ),
    st.builds(
        lambda r, ru, c, cu: f"Total: reserved={r}{ru}, committed={c}{cu}",
        figures,
        st.sampled_from(["KB", "MB", "GB", "B"]),
        figures,
        st.sampled_from(["KB", "MB", "GB", "B"]),
    ),
    st.sampled_from(["Total 1 2", " num     #instances         #bytes  class name (module)", "-----", ""]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(lines, max_size=40))
def test_any_jcmd_output_parses_or_raises_a_probe_error(body):
    text = "\n".join(body)
    for parse in (parse_class_histogram, parse_heap_info, parse_native_memory):
        try:
            parsed = parse(text)
        except JcmdOutputError as exc:
            assert isinstance(exc, ProbeError) and str(exc)
            continue
        names = ("total_instances", "total_bytes", "used", "committed", "reserved", "malloc", "after_gc")
        figures_read = [getattr(parsed, f, None) for f in names]
        figures_read += [x for row in getattr(parsed, "rows", []) for x in (row.instances, row.bytes)]
        assert all(x < 2**63 for x in figures_read if isinstance(x, int)), parsed  # a Java long, SQLite's too
    report = split_report(text)
    assert report.class_histogram is None or "num" in report.class_histogram
