"""`medic analyze`: in process through `main([...])` and as a real `python -m agent.cli.main` run."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli.main import main

REPO = Path(__file__).resolve().parent.parent
GiB = 2**30
T0 = 1_767_571_200  # a midnight (UTC)


def _rss(
    leak_pct_h: float, hours: float = 30, seed: int = 0, base: float = 2 * GiB
) -> list[tuple[int, float]]:
    """One sample a minute: floor + GC sawtooth + noise, plus a leak from the start if asked."""
    rng = random.Random(seed)
    out = []
    for i in range(int(hours * 60)):
        floor = base * (1 + leak_pct_h / 100 * i / 60)
        out.append((T0 + 60 * i, round(floor + 0.08 * base * (i % 7) / 7 + rng.gauss(0, 0.002 * base))))
    return out


def _write_jsonl(path: Path, limit_metric: str = "memory_limit_bytes", extra: str = "") -> Path:
    lines = []
    for name, pct in (("leaky", 4.0), ("steady", 0.0)):
        for ts, v in _rss(pct, seed=len(name)):
            lines.append(json.dumps({"ts": ts, "instance": name, "metric": "rss_bytes", "value": v}))
        lines.append(json.dumps({"ts": T0, "instance": name, "metric": limit_metric, "value": 4 * GiB}))
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def _oom(pct: float) -> float:
    return next(ts for ts, v in _rss(pct, seed=len("leaky")) if v >= 4 * GiB)


def test_json_lists_each_instance_with_its_findings_and_when_each_first_fired(tmp_path, capsys):
    path = _write_jsonl(tmp_path / "rec.jsonl")
    assert main(["analyze", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_name = {i["instance"]: i for i in doc["instances"]}
    assert set(by_name) == {"leaky", "steady"}
    assert by_name["steady"]["findings"] == []
    leak = next(f for f in by_name["leaky"]["findings"] if f["kind"] == "leak")
    assert leak["verdict"] == "leak" and T0 < leak["first_fired"] < _oom(4.0)
    assert leak["at_open"]["evidence"]["time_to_oom_seconds"] > 0
    assert doc["samples"] == 2 * (30 * 60 + 1) and doc["problems"]["count"] == 0
    assert doc["params"]["window"] == 6 * 3600


def test_the_table_is_for_people(tmp_path, capsys):
    assert main(["analyze", str(_write_jsonl(tmp_path / "rec.jsonl"))]) == 0
    out = capsys.readouterr().out
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["INSTANCE", "KIND", "VERDICT"]
    assert any(r.startswith("leaky") and " leak " in r for r in rows)
    assert any(r.startswith("steady") and "no findings" in r for r in rows)
    assert "2 instances, 3602 samples" in out


def test_a_limit_from_the_command_line_or_from_another_metric(tmp_path, capsys):
    path = _write_jsonl(tmp_path / "rec.jsonl", limit_metric="container_limit")
    assert main(["analyze", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(doc["instances_without_limit"]) == ["leaky", "steady"]
    assert main(["analyze", str(path), "--json", "--limit-metric", "container_limit"]) == 0
    assert json.loads(capsys.readouterr().out)["instances_without_limit"] == []
    assert main(["analyze", str(path), "--json", "--limit", "4Gi"]) == 0
    leaky = next(i for i in json.loads(capsys.readouterr().out)["instances"] if i["instance"] == "leaky")
    assert any(f["kind"] == "oom-risk" for f in leaky["findings"])


def test_bad_lines_are_skipped_and_reported_unless_strict(tmp_path, capsys):
    path = _write_jsonl(tmp_path / "rec.jsonl", extra="this is not json\n")
    assert main(["analyze", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert f"skipped {path}:3603: not a JSON object" in captured.err
    assert json.loads(captured.out)["problems"]["count"] == 1
    assert main(["analyze", str(path), "--strict"]) == 2
    assert f"{path}:3603" in capsys.readouterr().err


def test_a_sample_stamped_decades_away_is_dropped_not_replayed(tmp_path, capsys):
    """One stray time (a float 1e300, a 400-digit int, a year-5000 stamp) among a day of minutes
    would stretch the replay over millennia of empty buckets: dropped and said, the rest judged."""
    strays = [
        '{"ts": 1e300, "instance": "leaky", "metric": "rss_bytes", "value": 5}',
        '{"ts": 1' + "0" * 400 + ', "instance": "leaky", "metric": "rss_bytes", "value": 5}',
        '{"ts": 95617584000, "instance": "steady", "metric": "rss_bytes", "value": 5}',
        '{"ts": -86400, "instance": "steady", "metric": "rss_bytes", "value": 5}',
    ]
    path = _write_jsonl(tmp_path / "rec.jsonl", extra="\n".join(strays) + "\n")
    clean = _write_jsonl(tmp_path / "clean.jsonl")
    assert main(["analyze", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "skipped steady: rss_bytes: 2 samples stamped before 1970 or after 2100 dropped" in captured.err
    assert "skipped leaky: rss_bytes: 1 samples stamped before 1970 or after 2100 dropped" in captured.err
    report = json.loads(captured.out)
    assert main(["analyze", str(clean), "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    assert report["instances"] == expected["instances"]  # judged as if the strays were never there


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--limit", "lots"], "--limit: expected a size"),
        (["--horizon", "0s"], "horizon must be positive"),
    ],
)
def test_bad_options_exit_2_with_one_clear_line(tmp_path, capsys, args, message):
    path = _write_jsonl(tmp_path / "rec.jsonl")
    assert main(["analyze", str(path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_malformed_duration_is_a_usage_error_of_the_parser(tmp_path, capsys):
    path = _write_jsonl(tmp_path / "rec.jsonl")
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(path), "--window", "soon"])
    assert exc.value.code == 2
    assert "argument --window: expected a duration" in capsys.readouterr().err


def test_missing_and_empty_files_exit_2(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl: cannot read it" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["analyze", str(empty)]) == 2
    assert "no samples found" in capsys.readouterr().err


def test_progress_goes_to_stderr_when_asked(tmp_path, capsys):
    assert main(["analyze", str(_write_jsonl(tmp_path / "rec.jsonl")), "--json", "--progress"]) == 0
    captured = capsys.readouterr()
    assert "analysing 2/2 instances" in captured.err
    json.loads(captured.out)  # stdout stays clean JSON


def test_a_prometheus_export_through_the_real_command(tmp_path):
    values = [[ts, str(v)] for ts, v in _rss(4.0)]
    export = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {"metric": {"__name__": "process_resident_memory_bytes", "instance": "h:9100"}, "values": values},
                {"metric": {"__name__": "container_spec_memory_limit_bytes", "instance": "h:9100"}, "values": [[T0, str(4 * GiB)]]},
            ],
        },
    }  # fmt: skip
    path = tmp_path / "export.json"
    path.write_text(json.dumps(export))
    run = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "analyze", str(path), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    findings = doc["instances"][0]["findings"]
    assert doc["instances"][0]["instance"] == "h:9100"
    assert any(f["kind"] == "leak" and f["first_fired"] < _oom(4.0) for f in findings)
    assert run.stderr == ""  # no progress when stderr is not a terminal


def test_the_recorded_jemalloc_leak_of_the_benchmark_is_found(tmp_path, capsys):
    """A real recording (75 s of a leaking C program) replayed at its benchmark time scale."""
    from benchmarks.detection.corpus import CORPUS, load_recording

    label = next(
        (lab for lab in json.loads((CORPUS / "labels.json").read_text()) if lab["name"] == "c-leak-jemalloc"), None
    ) if (CORPUS / "labels.json").exists() else None  # fmt: skip
    if label is None:
        pytest.skip("the recorded corpus is not present")
    series = load_recording(CORPUS / label["file"])
    start = min(points[0][0] for points in series.values())
    rows = [
        json.dumps({"ts": T0 + (ts - start) * label["time_scale"], "instance": "je", "metric": m, "value": v})
        for m, points in series.items()
        for ts, v in points
    ]
    path = tmp_path / "je.jsonl"
    path.write_text("\n".join(rows) + "\n")
    assert main(["analyze", str(path), "--json", "--limit", str(label["limit_bytes"])]) == 0
    findings = json.loads(capsys.readouterr().out)["instances"][0]["findings"]
    leak = next(f for f in findings if f["kind"] == "leak")
    assert leak["evidence"]["series"] == "allocator_allocated_bytes"
    assert not math.isnan(leak["first_fired"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [("now", 1_000_000_000.0), ("2h", 1_000_000_000.0 - 7200), ("1700000000", 1_700_000_000.0)],
)
def test_start_and_end_name_a_moment_as_a_person_would(text, expected):
    from agent.cli.analyze import _resolve, instant

    assert _resolve(instant(text), now=1_000_000_000.0) == expected


def test_an_unreadable_moment_is_a_usage_error():
    import argparse

    from agent.cli.analyze import instant

    with pytest.raises((argparse.ArgumentTypeError, ValueError)):
        instant("yesterday-ish")
