"""`medic analyze` judges latency: p99 series in the input go through the online slow rules (SLO,
peers, trend) on the agent's grid and lifecycle, and slow findings appear in the table and --json."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.cli.main import main
from agent.detect.slow.detector import DEFAULT_SLOW, evaluate_slow
from agent.detect.slow.replay import _Window
from agent.detect.slow.rules import Slo
from agent.series.reader import read_files

T0 = 1_767_571_200  # a midnight (UTC)
P99 = "latency_p99_seconds"


def p99_file(path: Path, shape, names=("a", "b", "c", "d"), hours: float = 5, every: int = 15) -> Path:
    """One p99 sample every `every` s per instance: `shape(name, seconds_since_start)` + noise."""
    rng = random.Random(7)
    lines = []
    for name in names:
        for i in range(0, int(hours * 3600), every):
            value = shape(name, i) * (1 + rng.gauss(0, 0.03))
            lines.append(json.dumps({"ts": T0 + i, "instance": name, "metric": P99, "value": value}))
    path.write_text("\n".join(lines) + "\n")
    return path


def slow_hour(name: str, i: int) -> float:
    return 0.4 if name == "d" and 2 * 3600 <= i < 3 * 3600 else 0.05


def run_json(capsys, *argv: str) -> dict:
    assert main(["analyze", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def findings(doc: dict) -> dict[str, list[dict]]:
    return {i["instance"]: i["findings"] for i in doc["instances"]}


def test_a_slow_peer_is_found_while_slow_and_resolved_after(tmp_path, capsys):
    doc = run_json(capsys, str(p99_file(tmp_path / "p99.jsonl", slow_hour)))
    found = findings(doc)
    assert found["a"] == found["b"] == found["c"] == []
    [slow] = found["d"]
    assert slow["kind"] == "slow" and "peer" in slow["at_open"]["evidence"]["fired"]
    assert T0 + 2 * 3600 < slow["first_fired"] <= T0 + 2 * 3600 + 5 * 60  # within minutes of the onset
    assert T0 + 3 * 3600 < slow["resolved_at"] <= T0 + 3 * 3600 + 10 * 60


def test_the_slo_rule_judges_a_lone_instance(tmp_path, capsys):
    path = p99_file(tmp_path / "one.jsonl", slow_hour, names=("d",))
    assert findings(run_json(capsys, str(path)))["d"] == []  # no peers, no SLO: nothing to judge by
    [slow] = findings(run_json(capsys, str(path), "--slo", "250ms", "--slo-for", "5m"))["d"]
    assert slow["at_open"]["evidence"]["fired"] == ["slo"] and slow["at_open"]["severity"] == "error"
    assert T0 + 2 * 3600 + 4 * 60 <= slow["first_fired"] <= T0 + 2 * 3600 + 8 * 60


def test_growing_latency_fires_the_trend_rule(tmp_path, capsys):
    def growing(name: str, i: int) -> float:
        return 0.05 if i < 3600 else 0.05 * (1 + 8 * (i - 3600) / 3600)  # to 450 ms in an hour

    path = p99_file(tmp_path / "trend.jsonl", growing, names=("d",), hours=2)
    [slow] = findings(run_json(capsys, str(path), "--slo", "600ms"))["d"]
    assert slow["at_open"]["evidence"]["fired"] == ["trend"]  # under the SLO still, but soon over it


def test_the_table_names_the_slow_finding(tmp_path, capsys):
    assert main(["analyze", str(p99_file(tmp_path / "p99.jsonl", slow_hour))]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("d ") and " slow " in line for line in out.splitlines())
    assert "d is slow: p99" in out and "[peer]" in out


def test_offline_judgement_is_the_online_one(tmp_path):
    """At any tick the replay hands `evaluate_slow` what the detection job loads: the last
    `history` seconds; the same call on those samples gives the same observation."""
    result = read_files([p99_file(tmp_path / "p99.jsonl", slow_hour)])
    instances = result.instances()
    tick = T0 + 2 * 3600 + 600
    span = 1800 + DEFAULT_SLOW.stale + DEFAULT_SLOW.step
    online = [
        s.__class__(s.instance, {P99: [p for p in s.series[P99] if tick - span <= p[0] <= tick]})
        for s in instances
    ]
    replayed = [_Window(s).at(tick - span, tick) for s in instances]
    slos = dict.fromkeys("abcd", Slo(0.99, 0.25, 300))
    first = evaluate_slow(online, tick, slos=slos)
    second = evaluate_slow(replayed, tick, slos=slos)
    assert [(o.instance, o.state, o.evidence["fired"]) for o in first] == [
        (o.instance, o.state, o.evidence["fired"]) for o in second
    ]
    assert [o.state for o in second] == ["clear", "clear", "clear", "firing"]


def test_usage_errors(tmp_path, capsys):
    path = str(p99_file(tmp_path / "p99.jsonl", slow_hour, hours=0.2))
    assert main(["analyze", path, "--slo-for", "5m"]) == 2
    assert "--slo-for needs --slo" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # argparse: a unit was forgotten
        main(["analyze", path, "--slo", "5"])
    assert exited.value.code == 2 and "give a unit" in capsys.readouterr().err


latency_value = st.one_of(
    st.floats(min_value=-1, max_value=1e6, allow_nan=False),
    st.sampled_from(["NaN", "+Inf", "0.05", "x", None, True, [], {}]),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 4 * 3600), latency_value),
        max_size=300,
    )
)
def test_fuzz_latency_inputs_give_a_report_or_a_clear_error(tmp_path, capsys, rows):
    path = tmp_path / "fuzz.jsonl"
    path.write_text(
        "\n".join(json.dumps({"ts": T0 + ts, "instance": n, "metric": P99, "value": v}) for n, ts, v in rows)
        + "\n"
    )
    code = main(["analyze", str(path), "--slo", "250ms", "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 2) and "Traceback" not in err
    if code == 0:
        doc = json.loads(out)
        for instance in doc["instances"]:
            for finding in instance["findings"]:
                assert finding["kind"] == "slow" and math.isfinite(finding["first_fired"])
    else:
        assert err.startswith("medic: ")


# ----------------------------------------------------------------------------- histogram buckets
BOUNDS = ("0.025", "0.05", "0.1", "0.25", "0.5", "1", "+Inf")


def bucket_lines(name: str, hours: float = 5, every: int = 15) -> list[dict]:
    """A latency histogram scraped every `every` s: 100 requests an interval, about 40 ms, or
    about 400 ms for `d` in its third hour; cumulative counts per bound, as a server exposes them."""
    rng = random.Random(name)
    totals = dict.fromkeys(BOUNDS, 0)
    rows = []
    for i in range(0, int(hours * 3600), every):
        slow = name == "d" and 2 * 3600 <= i < 3 * 3600
        for _ in range(100):
            latency = rng.uniform(0.3, 0.45) if slow else rng.uniform(0.02, 0.06)
            for bound in BOUNDS:
                if latency <= float(bound):
                    totals[bound] += 1
        for bound in BOUNDS:
            metric = f'http_request_duration_seconds_bucket{{le="{bound}"}}'
            rows.append({"ts": T0 + i, "instance": name, "metric": metric, "value": totals[bound]})
    return rows


def test_histogram_buckets_are_judged_like_quantiles(tmp_path, capsys):
    path = tmp_path / "buckets.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for name in "abcd" for row in bucket_lines(name)))
    found = findings(run_json(capsys, str(path), "--slo", "250ms"))
    assert found["a"] == found["b"] == found["c"] == []
    [slow] = found["d"]
    assert slow["kind"] == "slow" and T0 + 2 * 3600 < slow["first_fired"] <= T0 + 2 * 3600 + 5 * 60


def test_only_the_wanted_quantile_is_made_and_it_is_the_same(tmp_path):
    from agent.series.buckets import quantiles_from_buckets

    path = tmp_path / "buckets.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in bucket_lines("d", hours=3.5)))
    [every] = read_files([path]).instances()
    [wanted] = read_files([path]).instances()
    quantiles_from_buckets([every])
    quantiles_from_buckets([wanted], wanted=[P99])
    assert {m for m in every.series if m.startswith("latency_")} == {
        "latency_p50_seconds", "latency_p90_seconds", P99, "latency_p999_seconds"
    }  # fmt: skip
    assert [m for m in wanted.series if m.startswith("latency_")] == [P99]
    assert wanted.series[P99] == every.series[P99]


def test_buckets_from_a_prometheus_export(tmp_path):
    from agent.series.buckets import quantiles_from_buckets

    series = {}
    for row in bucket_lines("a", hours=0.1):
        le = row["metric"].split('"')[1]
        series.setdefault(le, []).append([row["ts"], str(row["value"])])
    doc = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {"__name__": "http_request_duration_seconds_bucket", "le": le, "instance": "a"},
                    "values": v,
                }
                for le, v in series.items()
            ],
        },
    }
    path = tmp_path / "export.json"
    path.write_text(json.dumps(doc))
    [instance] = read_files([path]).instances()
    assert quantiles_from_buckets([instance]) == ["http_request_duration_seconds"]
    p99 = [v for _, v in instance.series[P99]]
    assert len(p99) == len(series["+Inf"]) - 1 and all(0.05 < v <= 0.1 for v in p99)


@settings(max_examples=200, deadline=None)
@given(
    scrapes=st.lists(
        st.lists(
            st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 10**6)),
            min_size=7,
            max_size=7,
        ),
        max_size=30,
    ),
    bounds=st.lists(
        st.sampled_from(["0.01", "0.1", "1", "10", "+Inf", "-1", "NaN", "x", "1e400"]), min_size=1, max_size=7
    ),
)
def test_fuzz_bucket_series_give_finite_quantiles_within_the_bounds(scrapes, bounds):
    from agent.detect.model import InstanceSeries
    from agent.series.buckets import quantiles_from_buckets

    metrics: dict = {}
    for k, counts in enumerate(scrapes):
        for bound, count in zip(bounds, counts, strict=False):
            metrics.setdefault(f'lat_seconds_bucket{{le="{bound}"}}', []).append((T0 + 15 * k, float(count)))
    series = InstanceSeries("a", metrics)
    quantiles_from_buckets([series])
    finite = [float(b) for b in bounds if b not in ("x", "NaN") and math.isfinite(float(b)) and float(b) >= 0]
    for metric in ("latency_p50_seconds", "latency_p99_seconds"):
        for _, value in series.series.get(metric, []):
            assert math.isfinite(value) and 0 <= value <= max(finite)


@pytest.mark.slow
def test_a_recording_of_a_real_degrading_server(spawn, tmp_path, capsys):
    """A real HTTP server whose latency grows 20 ms a second, its histogram scraped every second
    for 28 s and the recording stretched 30 times (a scrape every 30 s, 14 minutes): it is slow."""
    import time

    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from support.latency_app import start_app

    app = start_app(spawn, "--mode", "degrading", "--base", "0.01", "--growth", "0.02", "--load", "20")
    rows, began = [], time.monotonic()
    while (elapsed := time.monotonic() - began) < 28:
        text = httpx.get(app.url(), timeout=5).text
        ts = T0 + round(elapsed * 30)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "request_latency_seconds_bucket":
                    le = sample.labels["le"]
                    metric = f'request_latency_seconds_bucket{{le="{le}"}}'
                    rows.append({"ts": ts, "instance": "real", "metric": metric, "value": sample.value})
        time.sleep(max(0.0, 1.0 - (time.monotonic() - began - elapsed)))
    path = tmp_path / "real.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    [slow] = findings(run_json(capsys, str(path), "--slo", "250ms"))["real"]
    assert slow["kind"] == "slow" and set(slow["at_open"]["evidence"]["fired"]) <= {"slo", "trend"}
    assert slow["first_fired"] > T0 + 12 * 30  # not before its p99 grew past 250 ms


def _columns_of(metrics: dict) -> object:
    """An ImportResult holding `metrics` (metric → points) of instance "a", as a reader leaves it."""
    from agent.series.records import ImportResult

    result = ImportResult()
    for metric, points in metrics.items():
        times, values = result.column("a", metric)
        times.extend(ts for ts, _ in points)
        values.extend(v for _, v in points)
        result.points += len(points)
    return result


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 40),  # scrape number: repeats and gaps make bounds scraped at other times
            st.lists(
                st.one_of(
                    st.integers(0, 500).map(float),
                    st.floats(0, 1e6),
                    st.sampled_from([0.0, 1e-300, 1e300]),  # the readers keep only finite numbers
                ),
                min_size=6,
                max_size=6,
            ),
        ),
        max_size=40,
    ),
    bounds=st.lists(
        st.sampled_from(["0", "0.01", "0.1", "0.25", "1", "10", "+Inf", "-0"]), min_size=1, max_size=6
    ),
    aligned=st.booleans(),
    quantile=st.sampled_from([None, "latency_p50_seconds", P99, "latency_p999_seconds"]),
    rss_first=st.booleans(),
)
def test_quantiles_from_the_reader_columns_equal_those_from_points(
    rows, bounds, aligned, quantile, rss_first
):
    """The columnar path (C kernel when the bounds share increasing scrape times, else the points
    aligned by time) makes the same quantile points as `quantiles_from_buckets`, and leaves the
    same span of data and the same first series (restarts are inferred from it)."""
    from agent.series.buckets import quantiles_from_buckets, quantiles_from_columns

    if aligned:  # every bound at each of the same increasing times, as a Prometheus export has it
        rows = [(k, counts) for k, (_, counts) in enumerate(rows)]
    metrics: dict = {"rss_bytes": [(T0, 1e9), (T0 + 15 * 41, 1e9)]} if rss_first else {}
    for k, counts in rows:
        for bound, count in zip(bounds, counts, strict=False):
            metrics.setdefault(f'lat_seconds_bucket{{le="{bound}"}}', []).append((T0 + 15 * k, count))
    if not metrics:
        return
    wanted = None if quantile is None else [quantile]
    [expected] = _columns_of(metrics).instances()
    used = quantiles_from_buckets([expected], wanted)
    result = _columns_of(metrics)
    assert quantiles_from_columns(result, wanted) == used
    [got] = result.instances()
    for metric in ("latency_p50_seconds", P99, "latency_p90_seconds", "latency_p999_seconds"):
        assert got.series.get(metric) == expected.series.get(metric)
    assert (got.first_ts(), got.last_ts()) == (expected.first_ts(), expected.last_ts())
    first = next(iter(expected.series), None)
    assert list(got.series)[:1] == list(expected.series)[:1]
    if first is not None:
        assert got.series[first] == expected.series[first]


def test_a_prometheus_export_is_read_one_series_at_a_time_with_the_same_result(tmp_path):
    """The streaming reader and the whole-document reader give the same series, labels and
    problems; a document broken after its series still says where."""
    from agent.series.prometheus import read_prometheus_doc, stream_prometheus
    from agent.series.records import ImportResult

    doc = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {"__name__": "rss_bytes", "instance": "a"},
                    "values": [[T0, "1"], [T0 + 15, "NaN"]],
                },
                {"metric": {"__name__": "rss_bytes"}, "values": [[T0, "1"]]},  # no instance label
                {"metric": {"__name__": "rss_bytes", "instance": "b"}, "values": [[T0, "x"], [T0 + 15, "2"]]},
                {"metric": {"__name__": "rss_bytes", "instance": "a"}, "values": [[T0 + 30, 3]]},
            ],
        },
        "warnings": ["partial"],
    }
    for text in (json.dumps(doc), json.dumps(doc, indent=2)):
        streamed, whole = ImportResult(), ImportResult()
        assert stream_prometheus(text, "f", streamed, False, None)
        read_prometheus_doc(json.loads(text), "f", whole, False, None)
        assert (streamed.series, streamed.labels, streamed.problems, streamed.points) == (
            whole.series, whole.labels, whole.problems, whole.points
        )  # fmt: skip
    broken = json.dumps(doc)[:-1]
    assert not stream_prometheus(broken, "f", ImportResult(), False, None)
    path = tmp_path / "broken.json"
    path.write_text(broken)
    with pytest.raises(Exception, match="not valid JSON"):
        read_files([path])
    erred = json.dumps(doc).replace('"warnings"', '"status": "error", "warnings"')
    with pytest.raises(Exception, match="status 'error'"):
        stream_prometheus(erred, "f", ImportResult(), False, None)
