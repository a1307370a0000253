"""`/metrics` is encoded family by family from the texts the library wrote once: byte for byte what
prometheus_client's own encoders write for the whole registry at once, in every format and escaping
a scraper can ask for, gzipped or not, page after page; and a page is built once per tick and
variant, then served as bytes."""

from __future__ import annotations

import gzip

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from agent.api.exposition import PageEncoder, Rows
from agent.api.metrics import MAX_VARIANTS, Pages, render
from agent.api.snapshots import Ticks

ACCEPTS = (
    "*/*",
    "text/plain;version=1.0.0",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
    "text/plain;version=1.0.0;escaping=dots",
    "application/openmetrics-text;version=1.0.0",
    "application/openmetrics-text",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
    "application/openmetrics-text;version=1.0.0;escaping=values",
    "application/openmetrics-text;version=1.0.0;escaping=dots",
)
label_values = st.text(max_size=20)
values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1e12),
    # the values written in another form than repr's (and -0.0, equal to 0.0 but written otherwise)
    st.sampled_from([-0.0, 0.0, -1.5, float("inf"), float("-inf"), float("nan"), 1e22, 123456789.0, 7]),
)


class Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self):
        return iter(self.families)


def registry_of(rows: list[tuple[str, float]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    gauge = GaugeMetricFamily("medic_test_bytes", 'A "gauge"\nwith a newline.', labels=["name"])
    counter = CounterMetricFamily("medic_test_events", "A counter.", labels=["probe", "name"])
    info = InfoMetricFamily("medic_test", "An info.", labels=["name"])
    summary = Metric("medic_test_seconds", "Quantiles.", "summary")
    odd = Metric("medic:odd_name_bytes", "A colon, and a unit.", "gauge", "bytes")  # escapings differ
    stamped = GaugeMetricFamily("medic_test_stamped", "Samples with a timestamp.", labels=["name"])
    # instance rows: written from one kept label text per instance, not from samples
    rows_gauge = Rows("medic_test_rows_bytes", "Rows of a gauge.", "gauge")
    rows_counter = Rows("medic_test_rows_total", "Rows of a counter.", "counter")
    rows_odd = Rows("medic:odd_rows", "Rows the escaping may quote.", "gauge")
    rows_two = Rows("medic_test_rows_two", "Rows of two labels.", "gauge", ("probe", "name"))
    for i, (name, value) in enumerate(rows):
        label = f"{name}-{i}"  # one series per row
        for family in (rows_gauge, rows_counter, rows_odd):
            family.add(value, label)
        rows_two.add(value, name, label)
        gauge.add_metric([label], value)
        counter.add_metric(["process", label], value)
        info.add_metric([label], {"mode": name, "limit.source": name})
        summary.add_sample("medic_test_seconds", {"name": label, "quantile": "0.99"}, value)
        odd.add_sample("medic:odd_name_bytes", {"name": label}, value)
        stamped.add_metric([label], value, timestamp=1_700_000_000.5)
    families = [gauge, rows_gauge, counter, rows_counter, info, summary, odd, rows_odd, rows_two, stamped]
    families.append(GaugeMetricFamily("medic_empty", "None."))
    registry.register(Families(families))
    histogram = Histogram("medic_test_duration_seconds", "A histogram.", ["probe"], registry=registry)
    for _, value in rows:
        histogram.labels("process").observe(value)
    return registry


@settings(max_examples=60, deadline=None, database=None)
@given(st.lists(st.tuples(label_values, values), max_size=30))
def test_the_page_is_what_the_whole_registry_encodes_to(rows):
    registry = registry_of(rows)
    for accept in ACCEPTS:
        encoder, content_type = choose_encoder(accept)
        body, headers = render(registry, accept, "")
        assert body == encoder(registry), accept
        assert headers["Content-Type"] == content_type and "Content-Encoding" not in headers
        zipped, zipped_headers = render(registry, accept, "gzip, deflate")
        assert zipped_headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(zipped) == body


@settings(max_examples=30, deadline=None, database=None)
@given(st.lists(st.lists(st.tuples(label_values, values), max_size=12), min_size=2, max_size=4))
def test_one_encoder_page_after_page_writes_what_the_library_writes(pages):
    """The texts kept from one page serve the next, whose instances and values differ."""
    for accept in ACCEPTS:
        encoder, _ = choose_encoder(accept)
        kept = PageEncoder(encoder)
        for rows in pages:
            registry = registry_of(rows)
            assert kept.page(registry.collect(), gzipped=False) == encoder(registry), accept


class Counting:
    """A collector that counts how often a page asked for its families."""

    def __init__(self) -> None:
        self.collected = 0
        self.value = 1.0

    def collect(self):
        self.collected += 1
        gauge = GaugeMetricFamily("medic_test_bytes", "A gauge.", labels=["name"])
        gauge.add_metric(["a"], self.value)
        yield gauge


def test_a_page_is_built_once_per_tick_and_variant_and_again_when_old():
    counting = Counting()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(counting)
    ticks = Ticks()
    pages = Pages(registry, ticks, max_age=3600.0)
    first, _ = pages.get("*/*", "gzip")
    assert pages.get("*/*", "gzip")[0] == first and counting.collected == 1
    text, _ = pages.get("*/*", "")  # another variant: built on its own, once
    assert pages.get("*/*", "")[0] == text and counting.collected == 2
    assert gzip.decompress(first) == text
    counting.value = 2.0
    assert pages.get("*/*", "")[0] == text  # the samples changed, but no tick said so yet
    ticks.changed()
    assert b'medic_test_bytes{name="a"} 2.0' in pages.get("*/*", "")[0] and counting.collected == 3
    pages._pages.max_age = 0.0  # a page as old as max_age is built again, tick or not
    counting.value = 3.0
    assert b"} 3.0" in pages.get("*/*", "")[0] and counting.collected == 4


def test_the_variants_kept_are_bounded():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Counting())
    pages = Pages(registry, Ticks(), max_age=3600.0)
    for version in range(MAX_VARIANTS * 3):
        body, headers = pages.get(f"application/openmetrics-text;version=1.0.{version}", "")
        assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.")
        assert body.endswith(b"# EOF\n")
    assert len(pages._pages) == MAX_VARIANTS and len(pages._encoders) == MAX_VARIANTS


def test_an_openmetrics_page_ends_once_and_parses_strictly():
    body, _ = render(registry_of([("a", 1.0), ("b", 2.0)]), "application/openmetrics-text;version=1.0.0", "")
    assert body.count(b"# EOF\n") == 1 and body.endswith(b"# EOF\n")
    names = {family.name for family in parse_openmetrics(body.decode())}
    assert {"medic_test_bytes", "medic_test_events", "medic_test", "medic_test_duration_seconds"} <= names
    text, _ = render(registry_of([("a", 1.0)]), "*/*", "")
    assert b"# EOF" not in text


def test_the_agents_own_page_is_what_the_library_writes_for_it(tmp_path):
    """The instance families (label sets shared across families, counters, the summary, the info
    family) through the page's texts, against the library's encoders over the same registry."""
    from agent.api.metrics import Telemetry
    from agent.config.loader import validate_config
    from agent.core.catalog import CATALOG
    from agent.state.eventlog import EventLog
    from agent.state.store import Store
    from agent.watch.instances import ProbeHealth
    from agent.watch.tracker import Tracker

    specs = [
        {"name": "a", "match": {"pid": 1}, "labels": {"team": 'x"y\nz', "zone": "b"}},
        {"name": "b.c", "match": {"pid": 2}},
        {"name": "down", "match": {"pid": 3}},
    ]
    store = Store(tmp_path / "state")
    tracker = Tracker(validate_config({"instances": specs}).instances, store, EventLog(store))
    for i, name in enumerate(["a", "b.c"]):
        state = tracker.states[name]
        state.status, state.last_probe, state.restarts = "up", 1_700_000_000.0 + i, i
        state.latest = {metric: float(n * (i + 1)) for n, metric in enumerate(CATALOG)}
        state.probes = {"process": ProbeHealth(has_figures=True), "jvm": ProbeHealth(errors_total=2)}
    telemetry = Telemetry(tracker)
    telemetry.observe_probe("process", 0.002, True)
    try:
        for accept in ACCEPTS:
            encoder, _ = choose_encoder(accept)
            body, _ = render(telemetry.registry, accept, "")
            assert body == encoder(telemetry.registry) or _without_process(body) == _without_process(
                encoder(telemetry.registry)
            ), accept
        body, _ = render(telemetry.registry, "*/*", "")
        assert b'name="down"' in body and b'medic_latency_seconds{name="a",quantile="0.99"}' in body
        assert b'medic_probe_errors_total{name="b.c",probe="jvm"} 2.0' in body
    finally:
        store.close()


def _without_process(page: bytes) -> list[bytes]:
    """The page less the agent's own `process_*` lines (however the escaping writes them), which
    change between two reads."""
    return [line for line in page.splitlines() if b"process_" not in line or b"medic" in line]
