"""The C scan of a Prometheus export's `values` arrays (`_kernels.matrix_values`) reads exactly
what the json decoder path reads, leaves everything else to it, and the reader with or without the
extension gives the same series, problems, errors and findings."""

from __future__ import annotations

import json
import struct
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.cli.main import main
from agent.core.errors import MedicError, SeriesFormatError
from agent.series import prometheus
from agent.series.reader import read_text

kernels = prometheus._kernels
T0 = 1_767_571_200
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _doubles(raw: bytes) -> list[float]:
    out = array("d")
    out.frombytes(raw)
    return list(out)


def _outcome(text: str, strict: bool = False, label: str | None = None) -> tuple:
    """What the reader makes of `text`: every column's bytes (so -0.0 differs from 0.0), the
    labels, problems and points, or the error's message."""
    try:
        result = read_text(text, "f", strict=strict, label=label)
    except SeriesFormatError as exc:
        return ("error", str(exc))
    columns = {
        (instance, metric): (times.tobytes(), values.tobytes())
        for instance, metrics in result.columns.items()
        for metric, (times, values) in metrics.items()
    }
    return columns, result.labels, result.problems, result.problem_count, result.points


def _both(text: str, monkeypatch, strict: bool = False, label: str | None = None) -> tuple:
    scanned = _outcome(text, strict, label)
    with monkeypatch.context() as m:
        m.setattr(prometheus, "_kernels", None)  # what a build without the extension does
        decoded = _outcome(text, strict, label)
    return scanned, decoded


def _export(series_texts: list[str]) -> str:
    return (
        '{"status": "success", "data": {"resultType": "matrix", "result": [' + ", ".join(series_texts) + "]}}"
    )


def _series(values_text: str, instance: str = "a", name: str = "rss_bytes") -> str:
    labels = json.dumps({"__name__": name, "instance": instance})
    return f'{{"metric": {labels}, "values": {values_text}}}'


def test_the_scan_is_built_with_the_package():
    assert kernels is not None and hasattr(kernels, "matrix_values")


def test_prometheus_writes_are_scanned_as_doubles_and_gaps_left_out():
    text = '[[1767571200, "1.5"], [1767571215.5,"NaN"] ,[ 1767571230 , "+Inf"], [1.7e9, "-Inf"], [0, "2e3"]]'
    times, values, end = kernels.matrix_values(text, 0)
    assert end == len(text)
    assert _doubles(times) == [1767571200.0, 0.0] and _doubles(values) == [1.5, 2000.0]
    assert kernels.matrix_values("[]", 0) == (b"", b"", 2)
    assert kernels.matrix_values('x[[1, "2"]]', 1)[2] == 11  # from the index given


@pytest.mark.parametrize(
    "values",
    [
        '[[1, "1_0"]]',  # float() reads underscores: json's path decides
        '[[1, " 1"]]',
        '[[1, "\\u0031"]]',  # an escape
        "[[1, 2]]",  # a number, not a string
        '[["1", "2"]]',  # a string time
        '[[NaN, "2"]]',
        '[[1e999, "2"]]',  # a time that is not finite
        "[[1" + "0" * 400 + ', "2"]]',
        '[[01, "2"]]',
        '[[1, "2", 3]]',
        '[[1, "2"],]',
        '[[1, "2"]',  # truncated
        '[[1, "2',
        '[[true, "2"]]',
        '[{"ts": 1}]',
        '{"a": 1}',
    ],
)
def test_anything_but_the_shape_prometheus_writes_is_left_to_json(values):
    assert kernels.matrix_values(values, 0) is None


def test_the_scan_needs_ascii_text_and_an_index_inside_it():
    assert kernels.matrix_values('[[1, "é"]]', 0) is None
    assert kernels.matrix_values("[]", 3) is None
    assert kernels.matrix_values("[]", -1) is None
    with pytest.raises(TypeError):
        kernels.matrix_values(b"[]", 0)


# raw JSON tokens: what Prometheus writes, and the near misses around it
TIME_TOKENS = st.sampled_from(
    ["1767571200", "1767571200.5", "1.7e9", "-0", "0", "-0.0", "1E3", "1e400", "1" + "0" * 400, "01",
     "NaN", "Infinity", '"1767571200"', "true", "null", "1.", "+1"]
)  # fmt: skip
VALUE_TOKENS = st.sampled_from(
    ['"NaN"', '"+Inf"', '"-Inf"', '"inf"', '"Infinity"', '"nan"', '"-0"', '"1e400"', '"-1e400"', '"1_000"',
     '" 2"', '"2 "', '"0x10"', '"1e"', '"."', '"+.5"', '"5."', '"\\u0035"', '"é"', '"\\n"', "7", "7.5",
     '"' + "9" * 400 + '"', '"0.' + "3" * 30 + '"', "null", '""', '"1e-400"', "1" + "0" * 400]
)  # fmt: skip
NUMBER_TEXT = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-(10**20), 10**20).map(str),
    st.builds(lambda m, e: f"{m}e{e}", st.integers(-(10**17), 10**17), st.integers(-340, 340)),
)
SPACE = st.sampled_from(["", " ", "\n", "\t ", "\r\n"])


@st.composite
def values_text(draw) -> str:
    """A `values` array in raw JSON, mostly well formed, with odd tokens and spacing mixed in."""
    pairs = []
    for _ in range(draw(st.integers(0, 8))):
        ts = draw(st.one_of(TIME_TOKENS, st.integers(0, 2 * 10**9).map(str), NUMBER_TEXT))
        value = draw(st.one_of(VALUE_TOKENS, NUMBER_TEXT.map(lambda t: f'"{t}"')))
        s = draw(SPACE)
        pairs.append(f"[{s}{ts}{s},{draw(SPACE)}{value}{s}]")
    text = "[" + draw(SPACE) + f",{draw(SPACE)}".join(pairs) + draw(SPACE) + "]"
    if draw(st.integers(0, 9)) == 0 and text:
        text = text[: draw(st.integers(0, len(text) - 1))]  # truncated
    return text


@FUZZ
@given(st.lists(st.tuples(values_text(), st.sampled_from(["a", "b", "ü"])), max_size=4), st.booleans())
def test_the_reader_reads_the_same_with_and_without_the_scan(series, strict):
    """Series, labels, problems and points are the same bytes, or the error the same words; and
    nothing but a medic error ever leaves the reader."""
    text = _export([_series(values, instance) for values, instance in series])
    with pytest.MonkeyPatch.context() as monkeypatch:
        scanned, decoded = _both(text, monkeypatch, strict)
    assert scanned == decoded


@FUZZ
@given(values_text())
def test_what_the_scan_returns_is_what_json_reads(text):
    found = kernels.matrix_values(text, 0)
    if found is None:
        return
    times, values, end = found
    pairs = json.loads(text[:end])
    kept = [
        (float(ts), float(v)) for ts, v in pairs if abs(float(v)) != float("inf") and float(v) == float(v)
    ]
    assert [struct.pack("d", t) for t in _doubles(times)] == [struct.pack("d", t) for t, _ in kept]
    assert [struct.pack("d", v) for v in _doubles(values)] == [struct.pack("d", v) for _, v in kept]


@FUZZ
@given(st.text(max_size=200), st.integers(-5, 205))
def test_the_scan_of_any_text_is_a_result_or_none(text, start):
    found = kernels.matrix_values(text, start)
    assert found is None or (isinstance(found, tuple) and 0 <= found[2] <= len(text))


def test_a_truncated_export_is_a_clear_error_wherever_it_is_cut(monkeypatch):
    text = _export(
        [_series('[[1767571200, "1"], [1767571215, "2.5"], [1767571230, "NaN"]]', name)
         for name in ("a", "b")]
    )  # fmt: skip
    for cut in range(1, len(text) - 1):
        scanned, decoded = _both(text[:cut], monkeypatch)
        assert scanned == decoded
        if cut > len(text) - 3:  # only the document's own braces are missing
            assert scanned[0] == "error" and "not valid JSON" in scanned[1]


def test_an_export_laid_out_otherwise_is_read_as_before(monkeypatch):
    """Keys in another order, other keys, labels that are not an object, a pretty-printed document."""
    doc = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {"values": [[T0, "1"]], "metric": {"__name__": "rss_bytes", "instance": "a"}},
                {"metric": {"__name__": "rss_bytes", "instance": "b"}, "values": [[T0, "2"]], "extra": 1},
                {"metric": ["rss_bytes"], "values": [[T0, "3"]]},
                {"metric": {"__name__": "rss_bytes", "instance": "d"}, "values": "none"},
                {"metric": {"__name__": "rss_bytes", "instance": "e"}, "values": [[T0, "1"], [T0 + 15, "x"]]},
                {"metric": {"__name__": "rss_bytes", "instance": "f"}, "values": [[T0, "1"]]},
            ],
        },
    }
    twice = (
        '{"metric": {"__name__": "rss_bytes", "instance": "c"}, "values": [[1, "4"]], "values": [[1, "5"]]}'
    )
    with_twice = json.dumps(doc)[: -len("]}}")] + ", " + twice + "]}}"  # json keeps the last `values`
    for text in (with_twice, json.dumps(doc, indent=1)):
        for strict in (False, True):
            scanned, decoded = _both(text, monkeypatch, strict)
            assert scanned == decoded
    columns, _, problems, _, _ = _both(with_twice, monkeypatch)[0]
    assert {instance for instance, _ in columns} == {"a", "b", "c", "e", "f"}
    assert _doubles(columns[("c", "rss_bytes")][1]) == [5.0]
    assert len(problems) == 3  # labels not an object, values not a list, one malformed pair


def _bucket_export() -> str:
    """Four instances' cumulative histogram counters every 15 s for 4 h, `d` slow in its third hour."""
    bounds = ("0.025", "0.05", "0.1", "0.25", "0.5", "1", "+Inf")
    series = []
    for name in "abcd":
        totals = dict.fromkeys(bounds, 0)
        columns: dict[str, list] = {b: [] for b in bounds}
        for i in range(0, 4 * 3600, 15):
            slow = name == "d" and 2 * 3600 <= i < 3 * 3600
            for k in range(100):
                latency = 0.3 + 0.001 * (k % 50) if slow else 0.02 + 0.0004 * ((k * 7 + i) % 100)
                for bound in bounds:
                    if latency <= float(bound):
                        totals[bound] += 1
            for bound in bounds:
                columns[bound].append([T0 + i, str(float(totals[bound]))])
        for bound in bounds:
            labels = {"__name__": "http_request_duration_seconds_bucket", "le": bound, "instance": name}
            series.append({"metric": labels, "values": columns[bound]})
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": series}})


def test_medic_analyze_finds_the_same_with_and_without_the_scan(tmp_path, capsys, monkeypatch):
    path = tmp_path / "buckets.json"
    path.write_text(_bucket_export())

    def report() -> dict:
        assert main(["analyze", str(path), "--json", "--slo", "250ms"]) == 0
        doc = json.loads(capsys.readouterr().out)
        doc.pop("seconds")  # how long it took
        return doc

    scanned = report()
    monkeypatch.setattr(prometheus, "_kernels", None)
    decoded = report()
    assert scanned == decoded
    found = {i["instance"]: [f["kind"] for f in i["findings"]] for i in scanned["instances"]}
    assert found["d"] == ["slow"] and found["a"] == found["b"] == found["c"] == []


def test_garbage_around_the_scan_raises_nothing_but_medic_errors(monkeypatch):
    texts = (
        '{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": [[',
        _export([_series('[[1, "2"]]')]) + "x",
        _export([_series('[[1, "2"]] ]')]),
    )
    for text in texts:
        with pytest.raises(MedicError, match=r"^f"):
            read_text(text, "f")
        scanned, decoded = _both(text, monkeypatch)
        assert scanned == decoded


def test_labels_in_utf8_and_spaces_json_refuses_read_as_without_the_scan(monkeypatch):
    calls = []

    class Counting:
        """The kernels, counting the arrays the scan took."""

        def matrix_values(self, text, start):
            found = kernels.matrix_values(text, start)
            calls.append(found is not None)
            return found

    utf8 = _export(
        [_series('[[1, "2"], [2, "NaN"]]', "pod-é"), _series("[[1, 3]]", "pod-ü"), _series("[]", "ß")]
    )
    for text in (
        utf8,
        utf8.replace('"values": ', '"values":\u00a0'),
        utf8.replace('{"metric"', '{\u2003"metric"'),
    ):
        scanned, decoded = _both(text, monkeypatch)
        assert scanned == decoded
    monkeypatch.setattr(prometheus, "_kernels", Counting())
    assert _outcome(utf8) == _both(utf8, monkeypatch)[1]
    assert calls[:2] == [True, False]  # the first array scanned in UTF-8 text, the second left to json


def test_numbers_beyond_a_double_are_problems_not_crashes(monkeypatch):
    """A time of 401 digits was an OverflowError out of the reader; now that pair is skipped, and with
    it (the series read pair by pair) the values past a double's range."""
    text = _export(
        [
            _series(
                "[[1" + "0" * 400 + ', "1"], [2, "1e400"], [3, "-1e999"], [4, "' + "9" * 400 + '"], [5, "7"]]'
            )
        ]
    )
    scanned, decoded = _both(text, monkeypatch)
    assert scanned == decoded
    columns, _, problems, _, points = scanned
    assert [str(p) for p in problems] == [
        "f: series #1 (a, rss_bytes): skipped 4 malformed [ts, value] pairs"
    ]
    assert _doubles(columns[("a", "rss_bytes")][0]) == [5.0] and points == 1
