"""Memory attribution on recorded series: which layer holds the RSS and in which layer it grows."""

from __future__ import annotations

import pytest

from agent.core.histograms import HistogramRow, Snapshot
from agent.core.records import Sample
from agent.detect.explain.attribution import attribution_for
from agent.state.histograms import HistogramStore
from agent.state.store import Store

T0 = 1_800_000_000.0
MiB = 2**20
HOUR = 3600.0


def record(store: Store, series: dict[str, callable], minutes: int = 60, every: float = 30.0) -> None:
    """Samples of each metric every `every` seconds; values are functions of the seconds elapsed."""
    samples = []
    for k in range(int(minutes * 60 / every) + 1):
        t = k * every
        for metric, value in series.items():
            v = value(t)
            if v is not None:
                samples.append(Sample("svc", metric, T0 + t, float(v)))
    store.add_samples(samples)
    store.flush()


def grows(base: float, per_hour: float):
    return lambda t: base + per_hour * t / HOUR


def flat(value: float):
    return lambda t: value


def attribute(store: Store):
    return attribution_for(store, "svc", T0, T0 + HOUR)


def layers(result) -> dict[str, float]:
    return {layer.name: layer.bytes for layer in result.layers}


def test_jvm_with_nmt_growing_outside_what_nmt_sees(tmp_path):
    store = Store(tmp_path)
    record(
        store,
        {
            "rss_bytes": grows(900 * MiB, 40 * MiB),
            "rss_file_bytes": flat(60 * MiB),
            "jvm_heap_committed_bytes": flat(512 * MiB),
            "jvm_nmt_heap_committed_bytes": flat(512 * MiB),
            "jvm_nmt_committed_bytes": flat(700 * MiB),
            "jvm_nmt_malloc_bytes": flat(20 * MiB),
        },
    )
    result = attribute(store)
    assert result.growth_layer == "unexplained"
    assert "outside the Java heap and invisible to NMT" in result.verdict
    values = layers(result)
    assert values["jvm_heap"] == 512 * MiB and values["jvm_native"] == 188 * MiB
    assert values["unexplained"] == pytest.approx(result.rss_bytes - 760 * MiB)
    assert sum(values.values()) == pytest.approx(result.rss_bytes)
    growing = {layer.name: layer.bytes_per_second * HOUR for layer in result.layers}
    assert growing["unexplained"] == pytest.approx(40 * MiB, rel=0.05)
    assert result.rss_bytes_per_second * HOUR == pytest.approx(40 * MiB, rel=0.05)
    assert "allocator figures" in result.missing[0]


def test_committed_heap_that_is_not_resident_does_not_absorb_native_growth(tmp_path):
    """A JVM well below -Xmx: the heap and NMT commit more than RSS holds. Stacked and clipped, the heap
    layer would rise with the RSS; judged on its own figures it stays flat and the native leak is named."""
    store = Store(tmp_path)
    record(
        store,
        {
            "rss_bytes": grows(250 * MiB, 120 * MiB),
            "rss_file_bytes": flat(30 * MiB),
            "jvm_heap_committed_bytes": flat(512 * MiB),
            "jvm_heap_used_bytes": lambda t: 40 * MiB + 60 * MiB * ((t % 120) / 120),  # request garbage
            "jvm_nmt_heap_committed_bytes": flat(512 * MiB),
            "jvm_nmt_committed_bytes": flat(600 * MiB),
            "jvm_nmt_malloc_bytes": flat(10 * MiB),
        },
    )
    result = attribute(store)
    assert result.growth_layer == "unexplained", result.verdict
    assert "outside the Java heap and invisible to NMT" in result.verdict
    values = layers(result)
    assert values["jvm_heap"] <= 100 * MiB  # what the heap touched, not what it committed
    growing = {layer.name: layer.bytes_per_second * HOUR for layer in result.layers}
    assert growing["unexplained"] == pytest.approx(120 * MiB, rel=0.1)
    assert abs(growing["jvm_heap"]) < 5 * MiB


def test_python_native_growth_names_the_step_that_exists(tmp_path):
    """A Python target under glibc has no allocation-site snapshots: the next step is to enable them."""
    store = Store(tmp_path)
    record(
        store,
        {
            "rss_bytes": grows(300 * MiB, 100 * MiB),
            "python_gc_objects_bytes": flat(20 * MiB),
            "allocator_allocated_bytes": grows(200 * MiB, 100 * MiB),
            "allocator_resident_bytes": grows(220 * MiB, 100 * MiB),
        },
    )
    result = attribute(store)
    assert result.growth_layer == "allocator_live"
    assert "enable allocation sites: medic heap svc --sites 15m" in result.verdict
    assert "suspects" not in result.verdict


def test_jvm_without_nmt_says_how_to_see_more(tmp_path):
    store = Store(tmp_path)
    record(store, {"rss_bytes": grows(900 * MiB, 40 * MiB), "jvm_heap_committed_bytes": flat(512 * MiB)})
    result = attribute(store)
    assert result.growth_layer == "unexplained"
    assert "-XX:NativeMemoryTracking=summary" in result.verdict
    assert any("NativeMemoryTracking" in item for item in result.missing)


def test_java_heap_growth(tmp_path):
    store = Store(tmp_path)
    record(
        store,
        {"rss_bytes": grows(900 * MiB, 60 * MiB), "jvm_heap_committed_bytes": grows(512 * MiB, 60 * MiB)},
    )
    result = attribute(store)
    assert result.growth_layer == "jvm_heap" and "class suspects" in result.verdict


def test_fragmentation_is_free_memory_the_allocator_keeps(tmp_path):
    store = Store(tmp_path)
    record(
        store,
        {
            "rss_bytes": grows(400 * MiB, 100 * MiB),
            "allocator_allocated_bytes": flat(150 * MiB),
            "allocator_resident_bytes": grows(300 * MiB, 100 * MiB),
        },
    )
    result = attribute(store)
    assert result.growth_layer == "allocator_free"
    assert "fragmentation or retention" in result.verdict and "purge" in result.verdict
    assert layers(result)["allocator_live"] == 150 * MiB


def test_a_native_leak_is_in_live_allocations(tmp_path):
    store = Store(tmp_path)
    record(
        store,
        {
            "rss_bytes": grows(400 * MiB, 100 * MiB),
            "allocator_allocated_bytes": grows(300 * MiB, 100 * MiB),
            "allocator_resident_bytes": grows(320 * MiB, 100 * MiB),
        },
    )
    result = attribute(store)
    assert result.growth_layer == "allocator_live" and "heap_profiles" in result.verdict  # no sites yet
    HistogramStore(store).add(
        Snapshot(
            "svc", "jemalloc", T0 + 600, [HistogramRow("leak.c:12", 10.0, 4096.0)], 10.0, 4096.0, 1, 1.0, 1
        )
    )
    assert "see the allocation-site suspects" in attribute(store).verdict


def test_python_objects_with_and_without_pymalloc(tmp_path):
    store = Store(tmp_path / "a")
    record(
        store,
        {
            "rss_bytes": grows(300 * MiB, 50 * MiB),
            "python_gc_objects_bytes": grows(50 * MiB, 50 * MiB),
            "pymalloc_allocated_blocks": flat(10**6),
            "allocator_allocated_bytes": flat(100 * MiB),
            "allocator_resident_bytes": flat(110 * MiB),
        },
    )
    result = attribute(store)
    assert result.growth_layer == "python_objects" and "type suspects" in result.verdict
    assert layers(result)["allocator_live"] == 100 * MiB  # pymalloc on: the objects are outside malloc
    off = Store(tmp_path / "b")
    record(
        off,
        {
            "rss_bytes": flat(300 * MiB),
            "python_gc_objects_bytes": flat(50 * MiB),
            "allocator_allocated_bytes": flat(200 * MiB),
            "allocator_resident_bytes": flat(210 * MiB),
        },
    )
    result = attribute(off)
    assert layers(result)["allocator_live"] == 150 * MiB  # pymalloc off: the objects are inside malloc
    assert result.growth_layer is None and "no layer grows" in result.verdict


def test_a_gc_sawtooth_is_not_growth(tmp_path):
    store = Store(tmp_path)
    record(store, {"rss_bytes": lambda t: 500 * MiB + 100 * MiB * ((t % 300) / 300)})
    result = attribute(store)
    assert result.growth_layer is None
    assert result.rss_bytes == pytest.approx(500 * MiB, rel=0.05)  # the floor, not the peaks


def test_layers_never_exceed_rss(tmp_path):
    store = Store(tmp_path)
    record(
        store,
        {
            "rss_bytes": flat(300 * MiB),
            "jvm_heap_committed_bytes": flat(512 * MiB),  # committed, not all resident
            "allocator_allocated_bytes": flat(100 * MiB),
        },
    )
    values = layers(attribute(store))
    assert values["jvm_heap"] == 300 * MiB and values["allocator_live"] == 0 and values["unexplained"] == 0


def test_no_samples_yet(tmp_path):
    result = attribute(Store(tmp_path))
    assert result.rss_bytes is None and result.layers == [] and "no RSS samples" in result.verdict
    assert result.to_dict()["rss_bytes_per_hour"] is None


def test_the_text_names_no_layer_a_faster_one_outgrows():
    """Free memory the allocator keeps grows +1 GiB/h in jumps (below the confidence to name it),
    live allocations +21 MiB/h steadily: the sentence under the table must not say the growth is
    in live allocations."""
    from agent.detect.explain.attribution import TITLES, Attribution, Layer, _verdict

    result = Attribution("svc", 0.0, 3600.0, 4e9, 2**30 / 3600)
    result.layers = [
        Layer("allocator_live", 1e9, 21 * 2**20 / 3600, 0.999, TITLES["allocator_live"]),
        Layer("allocator_free", 2e9, 2**30 / 3600, 0.5, TITLES["allocator_free"]),
    ]
    layer, text = _verdict(result, 0.5, {"allocator_allocated_bytes": [1.0]}, False)
    assert layer is None
    assert "live native allocations" not in text.split(";")[0]
    assert text.startswith("free memory the allocator holds") and "1.0 GiB/h" in text
