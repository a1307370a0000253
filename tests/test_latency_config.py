"""The `latency:` section of an instance: defaults, round trips, and one clear line per mistake."""

from __future__ import annotations

import pytest

from agent.config.loader import parse_config, validate_config
from agent.core.errors import ConfigError

BASE = "instances: [{name: a, match: {pid: 3}, latency: %s}]"


def test_full_section_and_defaults():
    config = parse_config(
        BASE
        % (
            "{prometheus: {url: 'http://127.0.0.1:8501/metrics', histogram: request_latency_seconds,"
            " labels: {route: /predict}, errors_counter: errors_total, timeout: 500ms},"
            " canary: {url: 'http://127.0.0.1:8501/v1/predict', method: post, headers: {X-A: b},"
            " body_file: /tmp/body.json, interval: 30s},"
            " slo: {quantile: 0.999, threshold: 100ms, for: 10m}}"
        )
    )
    latency = config.instances[0].latency
    assert latency.prometheus.timeout == 0.5 and latency.prometheus.requests_counter is None
    assert latency.canary.method == "POST" and latency.canary.timeout == 2.0 and latency.canary.interval == 30
    assert (latency.slo.quantile, latency.slo.threshold, latency.slo.for_) == (0.999, 0.1, 600.0)
    assert parse_config(BASE % "{slo: {threshold: 1s}}").instances[0].latency.slo.for_ == 300.0
    assert parse_config("instances: [{name: a, match: {pid: 3}}]").instances[0].latency is None


def test_round_trip_through_plain_data_as_medic_run_does():
    config = parse_config(BASE % "{slo: {threshold: 80ms, for: 1m}}")
    again = validate_config(config.model_dump(mode="json", exclude_defaults=True))
    assert again.instances[0].latency.slo.for_ == 60.0


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("{prometheus: {url: ftp://x/metrics, histogram: h}}", r"latency\.prometheus\.url: expected an http"),
        (
            "{prometheus: {url: 'http://x/metrics'}}",
            r"latency\.prometheus: give exactly one of histogram, summary, counters \(got none\)",
        ),
        (
            "{prometheus: {url: 'http://x/m', histogram: h, summary: s}}",
            r"exactly one of histogram, summary, counters \(got histogram, summary\)",
        ),
        ("{prometheus: {url: 'http://x/m', summary: s_sum}}", r"without '_sum': s"),
        ("{prometheus: {url: 'http://x/m', counters: {total: t}}}", r"counters\.count: required"),
        (
            "{prometheus: {url: 'http://x/m', counters: {total: t, count: 'c c'}}}",
            r"counters\.count: expected",
        ),
        (
            "{prometheus: {url: 'http://x/m', summary: s, unit: ns}}",
            r"prometheus\.unit: Input should be 'seconds', 'milliseconds' or 'microseconds'",
        ),
        (
            "{prometheus: {url: 'http://x/m', counters: {total: t, count: c}}, slo: {threshold: 1s}}",
            r"latency: slo: latency\.prometheus\.counters give a mean latency, not a p99: an SLO on a quantile",
        ),
        ("{prometheus: {url: 'http://x/m', histogram: h_bucket}}", r"without '_bucket': h"),
        ("{prometheus: {url: 'http://x/m', histogram: 'a-b'}}", r"expected a Prometheus metric name"),
        ("{prometheus: {url: 'http://x/m', histogram: h, timeout: 2m}}", r"between 10ms and 60s"),
        ("{canary: {url: 'http://x/', method: FETCH}}", r"canary\.method: expected an HTTP method"),
        ("{canary: {url: 'http://x/', interval: 0s}}", r"canary\.interval: must be between"),
        ("{slo: {quantile: 0.95, threshold: 1s}}", r"slo\.quantile: expected one of 0.5, 0.9, 0.99, 0.999"),
        ("{slo: {quantile: 0.99, for: 5m}}", r"latency\.slo\.threshold: required, and has no default"),
        ("{slo: {threshold: 0s}}", r"slo\.threshold: must be above 0"),
        ("{slo: {for: soon}}", r"slo\.for: expected a duration"),
        ("{slo: {fro: 5m}}", r"latency\.slo\.fro: unknown key"),
        ("{histogram: h}", r"latency\.histogram: unknown key"),
    ],
)
def test_mistakes_are_one_clear_line(section, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(BASE % section)


def test_summary_and_counters_sources():
    summary = parse_config(BASE % "{prometheus: {url: 'http://x/m', summary: model_infer_request_duration}}")
    spec = summary.instances[0].latency.prometheus
    assert (spec.summary, spec.unit, spec.histogram, spec.counters) == (
        "model_infer_request_duration",
        "seconds",
        None,
        None,
    )
    counters = parse_config(
        BASE
        % (
            "{prometheus: {url: 'http://x/m', unit: microseconds, labels: {model_name: ranker},"
            " counters: {total: ts_inference_latency_microseconds, count: ts_inference_requests_total}}}"
        )
    )
    spec = counters.instances[0].latency.prometheus
    assert spec.summary is None and spec.counters.total == "ts_inference_latency_microseconds"
    again = validate_config(counters.model_dump(mode="json", exclude_defaults=True))
    assert again.instances[0].latency.prometheus.unit == "microseconds"
    # a summary may have quantiles: its SLO is judged when it does (docs/latency.md)
    assert (
        parse_config(BASE % "{prometheus: {url: 'http://x/m', summary: s}, slo: {threshold: 1s}}")
        .instances[0]
        .latency.slo
    )
