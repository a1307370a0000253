"""Offline readers: JSON Lines and Prometheus exports, bad lines, and garbage (hypothesis)."""

from __future__ import annotations

import gzip
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.core.errors import MedicError, SeriesFormatError
from agent.series import jsonl as series_jsonl
from agent.series.reader import read_files, read_text


def _line(ts, instance="a", metric="rss_bytes", value=1.0) -> str:
    return json.dumps({"ts": ts, "instance": instance, "metric": metric, "value": value})


def _prom(result: list, status="success", kind="matrix") -> str:
    return json.dumps({"status": status, "data": {"resultType": kind, "result": result}})


def test_json_lines_are_grouped_by_instance_and_metric_and_sorted():
    text = "\n".join([_line(2, "a"), _line(1, "a"), _line(1, "b", "memory_limit_bytes", 5), ""])
    result = read_text(text, "f.jsonl")
    assert result.points == 3 and result.problem_count == 0
    by_name = {s.instance: s for s in result.instances()}
    assert by_name["a"].series["rss_bytes"] == [(1, 1.0), (2, 1.0)]
    assert by_name["b"].series["memory_limit_bytes"] == [(1, 5)]


def test_malformed_lines_are_reported_with_their_line_number_and_the_rest_is_read():
    text = "\n".join(
        [_line(1), "{oops", _line(2, value="12.5"), '{"ts": 3}', _line(4, value=None), _line(5), "[1]"]
    )
    result = read_text(text, "rec.jsonl")
    assert result.points == 3  # lines 1, 3 (a numeric string) and 6
    lines = {p.line: p.message for p in result.problems}
    assert set(lines) == {2, 4, 5, 7}
    assert "not a JSON object" in lines[2] and "missing instance, metric, value" in lines[4]
    assert "value must be a number" in lines[5]
    assert str(result.problems[0]).startswith("rec.jsonl:2: ")


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("good"), st.integers(0, 10**6), st.sampled_from(["a", "b"])),
            st.tuples(
                st.just("bad"),
                st.sampled_from(
                    [
                        "{oops",
                        "",
                        "  ",
                        '{"ts": 1}',
                        "[1, 2]",
                        '{"ts": 1, "instance": "a", "metric": "m", "value": true}',
                    ]
                ),
                st.just(""),
            ),
        ),
        max_size=60,
    ),
    st.integers(1, 200),
)
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_chunked_reading_keeps_every_good_line_and_every_bad_line_number(monkeypatch, rows, chunk_chars):
    """Lines are parsed a chunk at a time: wherever the chunks fall, the same points are read
    and each bad line is reported with its own number."""
    monkeypatch.setattr(series_jsonl, "CHUNK_CHARS", chunk_chars)
    lines = [_line(ts, name, value=float(ts)) if kind == "good" else ts for kind, ts, name in rows]
    result = read_text("\n".join(lines) + "\n", "f.jsonl")
    good = [(ts, name) for kind, ts, name in rows if kind == "good"]
    assert result.points == len(good)
    read = sorted((ts, name) for name, metrics in result.series.items() for ts, _ in metrics["rss_bytes"])
    assert read == sorted((float(ts), name) for ts, name in good)
    reported = sorted(p.line for p in result.problems if p.line is not None)  # not "the file is empty"
    assert reported == sorted(
        i for i, (kind, _, _) in enumerate(rows, 1) if kind == "bad" and lines[i - 1].strip()
    )


def test_strict_stops_at_the_first_bad_line_and_says_how_to_go_on():
    with pytest.raises(SeriesFormatError, match=r"rec.jsonl:2: .*without --strict"):
        read_text(_line(1) + "\nnot json\n" + _line(2), "rec.jsonl", strict=True)


def test_non_finite_and_boolean_values_are_rejected():
    text = "\n".join(
        [_line(1, value=True), '{"ts": 1, "instance": "a", "metric": "m", "value": NaN}', _line(1e400)]
    )
    result = read_text(text, "f")
    assert result.points == 0 and result.problem_count == 3


def test_a_prometheus_export_maps_names_and_takes_the_instance_from_a_label():
    text = _prom(
        [
            {"metric": {"__name__": "process_resident_memory_bytes", "instance": "10.0.0.1:9100"}, "values": [[1, "5"], [2, "NaN"], [3, "7"]]},
            {"metric": {"__name__": "medic_rss_bytes", "name": "serving-0"}, "values": [[1, "9"]]},
            {"metric": {"__name__": "http_requests_total", "pod": "p"}, "values": [[1, "1"]]},
        ]
    )  # fmt: skip
    result = read_text(text, "export.json")
    assert result.series["10.0.0.1:9100"]["rss_bytes"] == [(1.0, 5.0), (3.0, 7.0)]  # NaN is a gap
    assert result.series["serving-0"]["rss_bytes"] == [(1.0, 9.0)]
    assert "http_requests_total" in result.series["p"]


def test_a_chosen_label_names_the_instance_and_a_series_without_it_is_reported():
    text = _prom(
        [
            {"metric": {"__name__": "process_resident_memory_bytes", "pod": "a", "instance": "x"}, "values": [[1, "5"]]},
            {"metric": {"__name__": "process_resident_memory_bytes", "instance": "y"}, "values": [[1, "5"]]},
        ]
    )  # fmt: skip
    result = read_text(text, "e.json", label="pod")
    assert list(result.series) == ["a"]
    assert result.problem_count == 1 and "lacks the label 'pod'" in str(result.problems[0])
    assert "label 'pod'" in str(result.problems[0]) and "--label" in str(result.problems[0])


def test_prometheus_documents_that_are_not_range_matrices_are_refused_clearly():
    with pytest.raises(SeriesFormatError, match="resultType is 'vector'; export a range query"):
        read_text(_prom([], kind="vector"), "e.json")
    with pytest.raises(SeriesFormatError, match="status 'error'"):
        read_text(json.dumps({"status": "error", "error": "bad query", "data": {}}), "e.json")
    with pytest.raises(SeriesFormatError, match=r"e.json:3: not valid JSON"):
        read_text('{\n "data": {"resultType": "matrix",\n ]', "e.json")


def test_malformed_pairs_of_a_prometheus_series_are_counted_and_skipped():
    text = _prom(
        [{"metric": {"__name__": "m", "instance": "i"}, "values": [[1, "2"], ["x", "3"], [2], [3, "4"]]}]
    )
    result = read_text(text, "e.json")
    assert result.series["i"]["m"] == [(1.0, 2.0), (3.0, 4.0)]
    assert "skipped 2 malformed" in str(result.problems[0])


def test_files_gzip_and_errors_name_the_file(tmp_path):
    plain, packed = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"
    plain.write_text(_line(1, "a") + "\n")
    packed.write_bytes(gzip.compress((_line(1, "b") + "\n").encode()))
    seen = []
    result = read_files([plain, packed], progress=lambda done, total: seen.append((done, total)))
    assert sorted(result.series) == ["a", "b"] and seen[-1][0] == seen[-1][1]
    with pytest.raises(SeriesFormatError, match=r"missing\.jsonl: cannot read it"):
        read_files([tmp_path / "missing.jsonl"])
    broken = tmp_path / "c.gz"
    broken.write_bytes(gzip.compress(b"x" * 100)[:20])
    with pytest.raises(SeriesFormatError, match="damaged gzip"):
        read_files([broken])
    binary = tmp_path / "d.bin"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SeriesFormatError, match="not UTF-8"):
        read_files([binary])


def test_a_gzip_bomb_a_fifo_and_a_device_are_refused_without_filling_memory_or_blocking(
    tmp_path, monkeypatch
):
    from agent.series import reader

    monkeypatch.setattr(reader, "MAX_INPUT_BYTES", 2**20)
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip.compress(b" " * (64 * 2**20)))  # 64 KiB on disk, 64 MiB inflated
    with pytest.raises(SeriesFormatError, match=r"bomb\.jsonl\.gz: more than 1 MiB of series"):
        read_files([bomb])
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes it: a plain read would wait for ever
    with pytest.raises(SeriesFormatError, match="not a regular file"):
        read_files([fifo])
    with pytest.raises(SeriesFormatError, match="not a regular file"):
        read_files(["/dev/zero"])
    members = tmp_path / "two.jsonl.gz"  # gzip members one after the other, as `cat a.gz b.gz` makes
    members.write_bytes(
        gzip.compress((_line(1, "a") + "\n").encode()) + gzip.compress((_line(1, "b") + "\n").encode())
    )
    assert sorted(read_files([members]).series) == ["a", "b"]


def test_an_empty_file_is_a_problem_not_a_crash():
    assert read_text("  \n\n", "e").problem_count == 1


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ
@given(st.text(max_size=300), st.booleans())
def test_garbage_text_raises_nothing_but_medic_errors(text, strict):
    try:
        read_text(text, "fuzz", strict=strict)
    except MedicError as exc:
        assert str(exc).startswith("fuzz")


@FUZZ
@given(st.lists(JSON, max_size=6), st.booleans())
def test_json_lines_of_any_shape_raise_nothing_but_medic_errors(values, strict):
    text = "\n".join(json.dumps(v) for v in values)
    try:
        result = read_text(text, "fuzz", strict=strict)
    except MedicError as exc:
        assert str(exc).startswith("fuzz")
    else:
        assert result.points + result.problem_count >= 0


@FUZZ
@given(JSON, st.booleans(), st.sampled_from([None, "instance", "pod"]))
def test_prometheus_documents_of_any_shape_raise_nothing_but_medic_errors(data, strict, label):
    text = json.dumps({"status": "success", "data": data})
    try:
        read_text(text, "fuzz", strict=strict, label=label)
    except MedicError as exc:
        assert str(exc).startswith("fuzz")


@FUZZ
@given(st.binary(max_size=200))
def test_garbage_files_raise_nothing_but_medic_errors(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("fuzz") / "f"
    path.write_bytes(raw)
    try:
        read_files([path])
    except MedicError as exc:
        assert str(path) in str(exc)
