"""`/metrics` is encoded family by family: byte for byte what prometheus_client's own encoders write
for the whole registry at once, in both formats, gzipped or not."""

from __future__ import annotations

import gzip

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from agent.api.metrics import render

ACCEPTS = (
    "*/*",
    "text/plain;version=1.0.0",
    "application/openmetrics-text;version=1.0.0",
    "application/openmetrics-text",
)
label_values = st.text(max_size=20)
values = st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1e12)


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
    for i, (name, value) in enumerate(rows):
        label = f"{name}-{i}"  # one series per row
        gauge.add_metric([label], value)
        counter.add_metric(["process", label], value)
        info.add_metric([label], {"mode": name})
        summary.add_sample("medic_test_seconds", {"name": label, "quantile": "0.99"}, value)
    registry.register(Families([gauge, counter, info, summary, GaugeMetricFamily("medic_empty", "None.")]))
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


def test_an_openmetrics_page_ends_once_and_parses_strictly():
    body, _ = render(registry_of([("a", 1.0), ("b", 2.0)]), "application/openmetrics-text;version=1.0.0", "")
    assert body.count(b"# EOF\n") == 1 and body.endswith(b"# EOF\n")
    names = {family.name for family in parse_openmetrics(body.decode())}
    assert {"medic_test_bytes", "medic_test_events", "medic_test", "medic_test_duration_seconds"} <= names
    text, _ = render(registry_of([("a", 1.0)]), "*/*", "")
    assert b"# EOF" not in text
