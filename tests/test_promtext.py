"""The exposition parser on real prometheus-client output, an OpenMetrics sample, garbage, and fuzzed input."""

from __future__ import annotations

import gzip
import math
import string

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    generate_latest,
)
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as reference_openmetrics
from prometheus_client.parser import text_string_to_metric_families as reference_text

from agent.core.errors import ProbeError
from probes.promtext import detect_format, parse_exposition

OM_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
NASTY = 'a "quoted" \\ back\nslash, {braces}, #hash, = equals, ünïcödé ✓'


def full_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    latency = Histogram("req_latency_seconds", "request latency", ["path"], registry=registry)
    requests = Counter("reqs", "requests", ["code"], registry=registry)
    gauge = Gauge("temperature", 'help with "quotes", \\ and\nnewline', registry=registry)
    summary = Summary("payload_bytes", "payload size", registry=registry)
    Info("build", "build info", registry=registry).info({"version": "1.2.3", "odd": NASTY})
    Enum("state", "server state", states=["starting", "serving"], registry=registry).state("serving")
    for value in (0.001, 0.02, 0.3, 2.0, 42.0):
        latency.labels(NASTY).observe(value)
        latency.labels("/plain").observe(value / 2)
    requests.labels("200").inc(3)
    gauge.set(float("nan"))
    summary.observe(512)
    return registry


def samples_of(exposition) -> dict[tuple, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in exposition.families.values()
        for s in family.samples
    }


def reference_samples(families) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all((math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


def test_prometheus_client_text_output_matches_its_own_parser():
    text = generate_latest(full_registry())
    exposition = parse_exposition(text, "text/plain; version=0.0.4")
    assert exposition.format == "text"
    assert same(samples_of(exposition), reference_samples(reference_text(text.decode())))
    hist = exposition.families["req_latency_seconds"]
    assert hist.type == "histogram" and hist.help == "request latency"
    buckets = [s for s in hist.samples if s.name.endswith("_bucket") and s.labels["path"] == NASTY]
    assert [s.labels["le"] for s in buckets][-1] == "+Inf" and buckets[-1].value == 5.0
    assert exposition.families["temperature"].help == 'help with "quotes", \\ and\nnewline'
    assert exposition.families["reqs_total"].type == "counter"


def test_prometheus_client_openmetrics_output_matches_its_own_parser():
    text = generate_openmetrics(full_registry())
    exposition = parse_exposition(text, OM_TYPE)
    assert exposition.format == "openmetrics"
    assert same(samples_of(exposition), reference_samples(reference_openmetrics(text.decode())))
    assert exposition.families["reqs"].type == "counter"
    assert {s.name for s in exposition.families["reqs"].samples} == {"reqs_total", "reqs_created"}
    assert exposition.families["state"].type == "stateset"
    assert exposition.families["build"].type == "info"


OPENMETRICS_SAMPLE = """\
# TYPE acme_http_request_seconds histogram
# UNIT acme_http_request_seconds seconds
# HELP acme_http_request_seconds Latency of \\"acme\\" requests.
acme_http_request_seconds_bucket{le="0.01",path="/"} 1 1700000000.000
acme_http_request_seconds_bucket{le="0.1",path="/"} 4 1700000000.000 # {trace_id="abc123"} 0.067 1699999999.5
acme_http_request_seconds_bucket{le="1",path="/"} 6 1700000000.000
acme_http_request_seconds_bucket{le="+Inf",path="/"} 7 1700000000.000
acme_http_request_seconds_count{path="/"} 7 1700000000.000
acme_http_request_seconds_sum{path="/"} 3.25 1700000000.000
acme_http_request_seconds_created{path="/"} 1699990000.0 1700000000.000
# TYPE acme_errors counter
acme_errors_total 3
acme_errors_created 1699990000.0
# TYPE acme_queue gaugehistogram
acme_queue_bucket{le="1"} 0
acme_queue_bucket{le="+Inf"} 2
acme_queue_gcount 2
acme_queue_gsum 5
# TYPE acme_up unknown
acme_up 1
# EOF
"""


def test_openmetrics_sample_with_units_exemplars_and_timestamps():
    assert detect_format(OPENMETRICS_SAMPLE, None) == "openmetrics"  # `# EOF` gives it away
    exposition = parse_exposition(OPENMETRICS_SAMPLE)
    family = exposition.families["acme_http_request_seconds"]
    assert (family.type, family.unit, family.help) == ("histogram", "seconds", 'Latency of "acme" requests.')
    assert len(family.samples) == 7
    bucket = family.samples[1]
    assert bucket.labels == {"le": "0.1", "path": "/"} and bucket.value == 4 and bucket.timestamp == 1.7e9
    assert [s.value for s in exposition.families["acme_errors"].samples] == [3, 1699990000.0]
    assert exposition.families["acme_queue"].type == "gaugehistogram"
    assert len(exposition.families["acme_queue"].samples) == 4
    assert same(samples_of(exposition), reference_samples(reference_openmetrics(OPENMETRICS_SAMPLE)))


def test_text_format_leniencies_prometheus_accepts():
    text = (
        "# a plain comment\r\n"
        "\r\n"
        "# TYPE x_seconds histogram\n"
        'x_seconds_bucket { le = "1" , path="/a" , } 3 1700000000000\n'
        'x_seconds_bucket{le="+Inf",path="/a"}\t4\n'
        '{"x.dotted.name", "odd.label"="v"} 2\n'
        "up 1\n"
        'x_seconds_count{path="/a"} 4\n'
    )
    exposition = parse_exposition(text)
    first = exposition.families["x_seconds"].samples[0]
    assert first.labels == {"le": "1", "path": "/a"} and first.timestamp == 1.7e9
    assert len(exposition.families["x_seconds"].samples) == 3  # interleaved families are fine
    assert exposition.families["x.dotted.name"].samples[0].labels == {"odd.label": "v"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<!DOCTYPE html><html><body>It works!</body></html>", r"line 1: expected a metric name"),
        (b'{"status": "ok", "uptime": 3}', r"line 1: expected ',' or '\}'"),
        (gzip.compress(b"up 1\n", mtime=0), r"not UTF-8 text .*binary, compressed or protobuf"),
        (b'up 1\nup{a="x"\n', r"line 2: unterminated"),
        (b"up\n", r"line 1: expected a value"),
        (b"up one\n", r"line 1: value 'one' is not a number"),
        (b"up 1_000\n", r"value '1_000' is not a number"),
        (b'up{a="1",a="2"} 1\n', r"label 'a' given twice"),
        (b'up{a="1"\n', r"line 1: unterminated"),
        (b'up{a="1" b="2"} 1\n', r"expected ',' or '\}'"),
        (b"up 1 12.5\n", r"timestamp must be integer milliseconds"),
        (b"# TYPE up sometype\nup 1\n", r"unknown metric type 'sometype'"),
        (b"# TYPE up gauge\n# TYPE up gauge\n", r"line 2: second # TYPE line for up"),
        (b"up 1\n# TYPE up gauge\n", r"# TYPE for up after its samples"),
        (b'up 1 # {a="b"} 1\n', r"unexpected '#' after the value"),
        (b"# TYPE up gauge\nup 1\n", None),
    ],
)
def test_garbage_is_a_clear_probe_error(body, message):
    if message is None:
        assert parse_exposition(body).families["up"].samples[0].value == 1
        return
    with pytest.raises(ProbeError, match=message) as caught:
        parse_exposition(body, source="http://127.0.0.1:8501/metrics")
    assert "http://127.0.0.1:8501/metrics" in str(caught.value)
    assert "is this URL a /metrics endpoint?" in str(caught.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("# TYPE up gauge\nup 1\n", r"does not end with '# EOF' \(truncated\?\)"),
        ("up 1\n# EOF\nup 2\n", r"line 3: content after '# EOF'"),
        ("# TYPE up gauge\nup 1 # nonsense\n# EOF\n", r"unexpected '#'"),
    ],
)
def test_openmetrics_structure_errors(body, message):
    with pytest.raises(ProbeError, match=message):
        parse_exposition(body, OM_TYPE)


def test_filtered_parse_keeps_only_wanted_families_and_still_rejects_garbage():
    text = generate_latest(full_registry())
    full = parse_exposition(text)
    only = parse_exposition(text, families={"req_latency_seconds"})
    assert set(only.families) == {"req_latency_seconds"}
    assert only.families["req_latency_seconds"].samples == full.families["req_latency_seconds"].samples
    assert "temperature" in only.declared  # every # TYPE is still read, for error messages
    with pytest.raises(ProbeError, match="line 1: expected a metric name"):
        parse_exposition(b"<html>\n", families={"req_latency_seconds"})


# ------------------------------------------------------------------------------------- fuzzing
_names = st.text(string.ascii_letters + string.digits + "_:", max_size=10)
_label_names = st.builds(
    str.__add__,
    st.sampled_from(string.ascii_letters),
    st.text(string.ascii_letters + string.digits + "_", max_size=8),
)
_label_values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_values = st.floats(allow_nan=True, allow_infinity=True)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _render_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


@st.composite
def expositions(draw):
    """(text, expected samples) for random gauge families rendered in the text format."""
    names = draw(st.lists(_names, min_size=1, max_size=4, unique=True))
    names = [f"m{i}_{n}" for i, n in enumerate(names)]  # no name is another's suffix form
    lines, expected = [], {}
    for name in names:
        lines.append(f"# TYPE {name} gauge")
        for labels in draw(st.lists(st.dictionaries(_label_names, _label_values, max_size=3), max_size=3)):
            value = draw(_values)
            stamp = draw(st.one_of(st.none(), st.integers(-(10**12), 10**13)))
            rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            line = (
                f"{name}{{{rendered}}} {_render_value(value)}" if labels else f"{name} {_render_value(value)}"
            )
            lines.append(line + (f" {stamp}" if stamp is not None else ""))
            expected[(name, tuple(sorted(labels.items())))] = value
    return "\n".join(lines) + "\n", expected


@given(expositions())
@settings(max_examples=200)
def test_fuzz_rendered_expositions_parse_back_exactly(case):
    text, expected = case
    parsed = samples_of(parse_exposition(text))
    assume(
        len(expected) == sum(len(f.samples) for f in parse_exposition(text).families.values())
    )  # no duplicates
    assert same(parsed, expected)


@given(
    st.dictionaries(_label_values, st.floats(allow_nan=False, min_value=-1e12, max_value=1e12), max_size=6)
)
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_real_prometheus_client_output_round_trips(values):
    registry = CollectorRegistry()
    gauge = Gauge("fuzzed", "fuzzed gauge", ["key"], registry=registry)
    for key, value in values.items():
        gauge.labels(key).set(value)
    for body, content_type in ((generate_latest(registry), None), (generate_openmetrics(registry), OM_TYPE)):
        family = parse_exposition(body, content_type).families["fuzzed"]
        assert {s.labels["key"]: s.value for s in family.samples} == values


@given(st.text(max_size=300))
@settings(max_examples=500)
def test_fuzz_any_text_parses_or_raises_probe_error(text):
    for content_type in (None, OM_TYPE):
        try:
            parse_exposition(text, content_type)
        except ProbeError as exc:
            assert "line" in str(exc) or "UTF-8" in str(exc)


@given(st.binary(max_size=300), st.sampled_from([None, {"up"}, {"req_latency_seconds"}]))
@settings(max_examples=300)
def test_fuzz_any_bytes_parse_or_raise_probe_error(data, families):
    try:
        parse_exposition(data, families=families)
    except ProbeError:
        pass


_REAL = generate_latest(full_registry()).decode()


@given(st.integers(0, len(_REAL) - 1), st.text(min_size=1, max_size=3), st.integers(0, 3))
@settings(max_examples=400)
def test_fuzz_mutated_real_output_parses_or_raises_probe_error(position, insert, delete):
    mutated = _REAL[:position] + insert + _REAL[position + delete :]
    for families in (None, {"req_latency_seconds"}):
        try:
            exposition = parse_exposition(mutated, families=families)
        except ProbeError:
            continue
        for family in exposition.families.values():
            for sample in family.samples:
                assert isinstance(sample.value, float)
