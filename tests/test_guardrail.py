"""`medic guardrail` without servers: its parsers, statistics, verdicts on known series, reports
and usage errors (exit 2 with one clear line). The runs on real onnxruntime servers are in
tests/test_guardrail_servers.py."""

from __future__ import annotations

import json
import math
import random
import threading
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.errors import UsageError
from agent.guardrail.driver import Driver, Record, round_order
from agent.guardrail.growth import Growth
from agent.guardrail.measure import BuildSeries
from agent.guardrail.options import (
    Options,
    ServerSpec,
    Thresholds,
    load_request_set,
    parse_fraction,
    parse_leak_rate,
    parse_rate,
    parse_template,
    server_spec,
)
from agent.guardrail.report import html_report, junit_server_failure, junit_xml, table
from agent.guardrail.run import Result
from agent.guardrail.stats import (
    binomial_tail,
    blocks_by_time,
    compare,
    more_errors_p,
    quantile,
    quantile_of_blocks,
    theil_sen,
    time_edges,
)
from agent.guardrail.verdicts import Measurement, _grows_more, holds_to_the_end, judge_all
from agent.jobs.warmup import WarmupRequest

MiB = 2**20


def test_templates_need_port_and_split_like_a_shell():
    assert parse_template("python -m srv --port {port} --name 'a b'", "--baseline") == (
        "python",
        "-m",
        "srv",
        "--port",
        "{port}",
        "--name",
        "a b",
    )
    assert ServerSpec("baseline", argv=("srv", "--listen=127.0.0.1:{port}")).command(81) == [
        "srv",
        "--listen=127.0.0.1:81",
    ]
    with pytest.raises(UsageError, match=r"\{port\}"):
        parse_template("python -m srv --port 8080", "--candidate")
    with pytest.raises(UsageError, match="cannot split"):
        parse_template("python 'unclosed {port}", "--candidate")
    with pytest.raises(UsageError, match="empty"):
        parse_template("   ", "--baseline")


def test_server_spec_is_a_template_or_a_url_with_a_pid():
    assert server_spec("baseline", None, "http://127.0.0.1:8501", 42).url == "http://127.0.0.1:8501/"
    with pytest.raises(UsageError, match="not both"):
        server_spec("baseline", "srv {port}", "http://127.0.0.1:1", 1)
    with pytest.raises(UsageError, match="--candidate-pid"):
        server_spec("candidate", None, "http://127.0.0.1:1", None)
    with pytest.raises(UsageError, match="http://"):
        server_spec("candidate", None, "ftp://x", 5)


def test_rates_fractions_and_leak_rates():
    assert parse_rate("50/s") == 50 and parse_rate("600/min") == 10 and parse_rate("0.5/s") == 0.5
    assert parse_fraction("10%", "--x") == pytest.approx(0.1) and parse_fraction("0.25", "--x") == 0.25
    assert parse_leak_rate("256Ki/min") == pytest.approx(256 * 1024 / 60)
    for bad in ("50", "fast/s", "0/s", "5000/s", "50/fortnight", "nan/s", "inf/s"):
        with pytest.raises(UsageError, match="--rate"):
            parse_rate(bad)
    for bad in ("ten", "-5%", "nan", "1e9"):
        with pytest.raises(UsageError):
            parse_fraction(bad, "--max-slowdown")
    with pytest.raises(UsageError, match="--leak-threshold"):
        parse_leak_rate("1Mi")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_the_parsers_refuse_anything_with_a_usage_error(text):
    for parse in (
        parse_rate,
        parse_leak_rate,
        lambda t: parse_template(t, "--baseline"),
        lambda t: parse_fraction(t, "--x"),
    ):
        try:
            value = parse(text)
        except UsageError as exc:
            assert str(exc).startswith("--")
        else:
            assert value is not None
            if isinstance(value, float):
                assert math.isfinite(value) and value >= 0


def test_requests_come_from_the_warmup_loader(tmp_path):
    (tmp_path / "a.http").write_text("POST /v1/predict\nContent-Type: application/json\n\n{}")
    (tmp_path / "b.json").write_text("{}")
    requests = load_request_set(str(tmp_path))
    assert [(r.method, r.target) for r in requests] == [("POST", "/v1/predict"), ("POST", "")]
    (tmp_path / "c.http").write_text("GET http://elsewhere:1/x\n")
    with pytest.raises(UsageError, match="absolute URL"):
        load_request_set(str(tmp_path))
    with pytest.raises(UsageError, match="not a directory"):
        load_request_set(str(tmp_path / "missing"))


def test_abba_order():
    assert [round_order(r) for r in range(6)] == [0, 1, 1, 0, 0, 1]


class _Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status = 500 if self.path == "/fail" else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_servers():
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Answer) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield [f"http://127.0.0.1:{server.server_address[1]}/" for server in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("load", [{"rate": 40.0, "concurrency": None}, {"rate": None, "concurrency": 2}])
def test_the_driver_sends_the_same_pairs_to_both_in_the_round_order(http_servers, load):
    requests = [
        WarmupRequest("a", "POST", "/ok", {}, b"{}"),
        WarmupRequest("b", "POST", "/fail", {}, b"{}"),
    ]
    driver = Driver(requests, (http_servers[0], http_servers[1]), timeout=2.0, **load)
    driver.run(1.0, first=1)  # the candidate first
    base, cand = driver.records
    assert base.count == cand.count >= 20
    assert base.failures == cand.failures and "HTTP 500 for POST /fail" in cand.errors
    assert sum(c < b for b, c in zip(base.sent, cand.sent)) > 0.9 * base.count
    driver.run(0.5, first=0, record=False)
    assert driver.records[0].count == base.count  # the warm-up is not recorded


def test_quantile_and_exact_tests():
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5 and math.isnan(quantile([], 0.5))
    assert binomial_tail(0, 10, 0.5) == 1.0 and binomial_tail(11, 10, 0.5) == 0.0
    assert binomial_tail(10, 10, 0.5) == pytest.approx(2**-10)
    assert more_errors_p(0, 1000, 0, 1000) == 1.0
    assert more_errors_p(0, 1000, 12, 1000) < 0.001  # 12 against none: not chance
    assert more_errors_p(5, 1000, 6, 1000) > 0.3
    assert binomial_tail(5000, 10000, 0.5) == pytest.approx(0.504, abs=0.01)  # large n: no overflow
    assert theil_sen([(x, 2 * x) for x in range(10)] + [(10, 500)]) == pytest.approx(2.0)  # one spike ignored


def _lat_blocks(rng: random.Random, factor: float, n: int = 2000):
    times = [i * 0.01 for i in range(n)]
    noise = [1 + 0.5 * math.sin(i / 50) for i in range(n)]  # shared slow noise, as on a busy machine
    base = [0.002 * noise[i] * rng.lognormvariate(0, 0.2) for i in range(n)]
    cand = [0.002 * factor * noise[i] * rng.lognormvariate(0, 0.2) for i in range(n)]
    edges = time_edges(0, n * 0.01, 40)
    return blocks_by_time(times, base, edges), blocks_by_time(times, cand, edges)


def test_bootstrap_tells_a_slowdown_from_noise():
    rng = random.Random(3)
    same = compare(
        *_lat_blocks(rng, 1.0), quantile_of_blocks(0.5), threshold=0.1, confidence=0.99, resamples=300, seed=1
    )
    assert same.low < 1 < same.high and abs(same.ratio - 1) < 0.05
    slower = compare(
        *_lat_blocks(rng, 1.3), quantile_of_blocks(0.5), threshold=0.1, confidence=0.99, resamples=300, seed=1
    )
    assert slower.low > 1.15 and slower.above_threshold > 0.99


def _record(
    rng: random.Random, start: float, seconds: float, rate: float, latency: float, errors: float = 0.0
) -> Record:
    record = Record()
    for i in range(int(seconds * rate)):
        failed = rng.random() < errors
        record.add(start + i / rate, latency * rng.lognormvariate(0, 0.15), "HTTP 500" if failed else None)
    return record


def _build(
    name: str,
    start: float,
    seconds: float,
    rss_rate: float,
    live_rate: float,
    rng: random.Random,
    cpu: float = 0.001,
    cpu_noise: float = 0.0,
) -> BuildSeries:
    """`cpu` seconds a request at 20 requests a second, each quarter second's share scattered by
    `cpu_noise` (a lognormal sigma)."""
    build = BuildSeries(name)
    used = 0.0
    for i in range(int(seconds / 0.25) + 1):
        t = start + i * 0.25
        build.add("rss_bytes", t, 200 * MiB + rss_rate * i * 0.25 + rng.gauss(0, 0.3 * MiB))
        build.add("allocator_allocated_bytes", t, 60 * MiB + live_rate * i * 0.25 + rng.gauss(0, 0.05 * MiB))
        build.add("cpu_seconds_total", t, used)
        used += cpu * 0.25 * 20 * (rng.lognormvariate(0, cpu_noise) if cpu_noise else 1.0)
        build.answered.append((t, int(i * 0.25 * 20)))
    return build


def _measurement(
    cand_rss: float = 0.0,
    cand_live: float = 0.0,
    cand_latency: float = 0.002,
    cand_errors: float = 0.0,
    cand_cpu: float = 0.001,
    cpu_noise: float = 0.0,
):
    rng = random.Random(7)
    start, seconds = 1_000_000.0, 30.0
    builds = (
        _build("baseline", start, seconds, 0.0, 0.0, rng, cpu_noise=cpu_noise),
        _build("candidate", start, seconds, cand_rss, cand_live, rng, cand_cpu, cpu_noise),
    )
    records = (
        _record(rng, 0.0, seconds, 20, 0.002),
        _record(rng, 0.0, seconds, 20, cand_latency, cand_errors),
    )
    rounds = [(start, start + 15, 0), (start + 15, start + 30, 1)]
    return Measurement(start, start + seconds, rounds, records, start, builds, 4 * 2**30)


def _verdicts(**kwargs):
    return {v.name: v for v in judge_all(_measurement(**kwargs), Thresholds(), resamples=200)}


def test_identical_builds_pass_every_verdict():
    verdicts = _verdicts()
    assert all(v.status == "pass" for v in verdicts.values()), {k: v.summary for k, v in verdicts.items()}
    assert all(v.confidence is None or 0 <= v.confidence <= 1 for v in verdicts.values())


def test_live_growth_is_a_leak_and_rss_growth_alone_is_fragmentation():
    leak = _verdicts(cand_rss=2 * MiB, cand_live=2 * MiB)
    assert leak["leak"].failed and not leak["fragmentation"].failed and leak["peak-memory"].failed
    assert leak["leak"].evidence["candidate"]["series"] == "allocator_allocated_bytes"
    assert "reaches the 4.0 GiB limit" in leak["leak"].summary
    frag = _verdicts(cand_rss=2 * MiB, cand_live=0.0)
    assert frag["fragmentation"].failed and not frag["leak"].failed
    assert frag["fragmentation"].confidence > 0.99


def test_growth_counts_only_when_it_still_outgrows_the_baseline_in_the_last_round():
    # round slopes (KiB/s) of real demo servers beside three CPU burners: both builds warm up in
    # the first round, out of step, then stop; a fragmenting build grows ~1 MiB/s in every round
    t, k = Thresholds(), 1024.0
    warm_ups = [([87.2, 1.2], [13.2, 0.0]), ([66.7, 36.7], [89.7, 1.6]), ([15.6, 0.0], [81.6, 1.2])]
    for cand, base in warm_ups:
        assert not holds_to_the_end([c * k for c in cand], [b * k for b in base], t)
    assert holds_to_the_end([1032.2 * k, 1025.0 * k], [14.9 * k, 1.3 * k], t)
    assert holds_to_the_end([1025.0 * k, 1024.0 * k], [], t)  # no baseline figures: against zero
    assert not holds_to_the_end([1025.0 * k, 1024.0 * k], [900.0 * k, 900.0 * k], t)  # both grow alike
    # of more rounds: every one but one in four, and never the last
    assert holds_to_the_end([9 * k, 0.0, 9 * k, 9 * k], [0.0] * 4, t)
    assert not holds_to_the_end([9 * k, 0.0, 0.0, 9 * k], [0.0] * 4, t)
    assert not holds_to_the_end([9 * k, 9 * k, 9 * k, 0.0], [0.0] * 4, t)
    assert holds_to_the_end([], [], t)  # nothing to tell the run's verdict from

    def grown(slope: float, rounds: list[float]) -> Growth:
        return Growth("rss_bytes", True, 0.999, slope * k, None, "", None, [r * k for r in rounds])

    # the first warm-up above over the run: a regression by every run-wide test, not by the rounds
    failed, excess, said = _grows_more(grown(44.0, [87.2, 1.2]), grown(6.6, [13.2, 0.0]), t)
    assert (
        not failed and excess > t.leak_rate and said.startswith(" (grew early in the run only: 72.0 KiB/min")
    )
    assert _grows_more(grown(1.0, [87.2, 1.2]), grown(0.5, [13.2, 0.0]), t)[2] == ""  # under the threshold


def _stepped(name: str, rng: random.Random, start: float, rate: float) -> BuildSeries:
    """45 s of a server whose RSS steps up 5 MiB as it warms up, then grows `rate` bytes a second,
    its allocated bytes flat."""
    build = BuildSeries(name)
    for i in range(181):
        t, x = start + i * 0.25, i * 0.25
        step = 5 * MiB * (1 - math.exp(-x / 3))
        build.add("rss_bytes", t, 72 * MiB + step + rate * x + rng.gauss(0, 0.05 * MiB))
        build.add("allocator_allocated_bytes", t, 17 * MiB + rng.gauss(0, 0.01 * MiB))
        build.answered.append((t, i * 4))
    return build


def _fragmentation(build, seed: int, rate: float):
    """The fragmentation verdict of a 45 s run in two rounds: a flat baseline against a candidate
    whose RSS grows `rate` bytes a second, each made by `build(name, rng, start, rate)`."""
    rng, start = random.Random(seed), 1_000_000.0
    rounds = [(start, start + 22.5, 0), (start + 22.5, start + 45, 1)]
    builds = (build("baseline", rng, start, 0.0), build("candidate", rng, start, rate))
    records = (_record(rng, 0.0, 45, 16, 0.002), _record(rng, 0.0, 45, 16, 0.002))
    m = Measurement(start, start + 45, rounds, records, start, builds, 4 * 2**30)
    return {v.name: v for v in judge_all(m, Thresholds(), resamples=100)}["fragmentation"]


@pytest.mark.parametrize("seed", range(3))
def test_a_warm_up_step_then_steady_rss_growth_is_fragmentation_and_the_step_alone_is_not(seed):
    steady = _fragmentation(
        _stepped, seed, 0.2 * MiB
    )  # a chunk kept every few requests, as a fragmenting server under load
    assert steady.failed, steady.summary
    assert "a step at the start" in steady.evidence["candidate_rss"]["detector_summary"]
    warm_up = _fragmentation(_stepped, seed + 100, 0.0)
    assert not warm_up.failed, warm_up.summary
    assert warm_up.evidence["candidate_rss"]["detector"] == "not firing"


def _sparse(name: str, rng: random.Random, start: float, rate: float) -> BuildSeries:
    """45 s of a server whose RSS grows `rate` bytes a second, its allocated bytes flat, sampled as
    on a loaded machine: nothing in the first and last 1.5 s, and stalls of 1-4 s between."""
    build = BuildSeries(name)
    x = 1.5
    while x < 43.5:
        t = start + x
        build.add("rss_bytes", t, 75 * MiB + rate * x + rng.gauss(0, 0.3 * MiB))
        build.add("allocator_allocated_bytes", t, 17 * MiB + rng.gauss(0, 0.01 * MiB))
        build.answered.append((t, round(x * 16)))
        x += 0.25 if rng.random() > 0.3 else rng.uniform(1, 4)
    return build


@pytest.mark.parametrize("seed", range(3))
def test_steady_growth_the_detector_holds_unconfirmed_counts_when_every_round_shows_it(seed):
    steady = _fragmentation(
        _sparse, seed, 1.0 * MiB
    )  # the fragmenting demo server under load: 1 MiB a second
    assert steady.failed, steady.summary
    assert "the rounds confirm" in steady.evidence["candidate_rss"]["detector_summary"]
    flat = _fragmentation(_sparse, seed + 100, 0.0)
    assert not flat.failed, flat.summary
    assert flat.evidence["candidate_rss"]["detector"] == "not firing"


def test_slower_and_errors_are_judged_by_their_tests():
    slower = _verdicts(cand_latency=0.0026)
    assert slower["slower"].failed and "p50" in slower["slower"].summary
    under = _verdicts(cand_latency=0.00205)["slower"]  # 2.5 %: under the 10 % threshold
    assert (
        not under.failed and under.summary.startswith("not slower") and "inconclusive" not in under.evidence
    )
    errors = _verdicts(cand_errors=0.05)
    assert errors["errors"].failed and "HTTP 500" in errors["errors"].summary


def test_a_regression_measured_over_the_threshold_but_within_the_noise_is_not_called_alike():
    noisy = _verdicts(cand_latency=0.0022)["slower"]  # +10.4 % measured, +8.0 % at 99 % confidence
    assert noisy.status == "pass" and noisy.evidence["inconclusive"] == ["p50"]
    assert noisy.summary.startswith("not shown slower") and "too noisy to tell, run longer" in noisy.summary
    cpu = _verdicts(cand_cpu=0.00125, cpu_noise=0.3)["cpu"]  # +31 % measured, +15 % at 99 % confidence
    assert cpu.status == "pass" and cpu.evidence["inconclusive"] == ["cpu"]
    assert cpu.summary.startswith("not shown to use more CPU") and "too noisy to tell" in cpu.summary
    assert _verdicts(cand_cpu=0.0015, cpu_noise=0.3)["cpu"].failed  # +57 %: shown


def _result(**kwargs) -> Result:
    m = _measurement(**kwargs)
    verdicts = judge_all(m, Thresholds(), resamples=100)
    spec = ServerSpec("baseline", argv=("srv", "--port", "{port}", "</script><b>"))
    options = Options(spec, ServerSpec("candidate", argv=("srv", "{port}")), [], "req", duration=30, warmup=1)
    return Result(
        options, verdicts, m, {"baseline": 0.1, "candidate": 0.1}, 0, ["a note with <tag> & \x1b[2J"]
    )


def test_reports_are_self_contained_and_escaped():
    result = _result(cand_rss=2 * MiB, cand_live=2 * MiB)
    page = html_report(result)
    assert "<svg" in page and "<polyline" in page and "</script><b>" not in page and "&lt;tag&gt;" in page
    for external in ("http://", "https://", "src=", "<link", "@import"):
        assert external not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    suite = ET.fromstring(junit_xml(result))
    assert suite.get("failures") == str(len(result.regressions)) and suite.get("tests") == "6"
    assert {c.get("name") for c in suite if c.find("failure") is not None} >= {"leak"}
    assert "\x1b" not in table(result) and "leak" in table(result)
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["result"] == "regression" and "leak" in doc["regressions"] and doc["exit_code"] == 1
    crash = ET.fromstring(junit_server_failure("candidate", "the candidate server exited\n  Traceback <x>"))
    assert crash.get("errors") == "1" and "candidate" in crash[0].get("name")


def medic(capsys, *args: str) -> tuple[int, str]:
    """`medic guardrail ARGS` in this process: (exit status, stderr)."""
    from agent.cli.main import main

    try:
        code = main(["guardrail", *args])
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--baseline", "srv --port 1", "--candidate", "srv {port}"], "must say where to listen with {port}"),
        (
            ["--baseline", "srv {port}", "--candidate", "srv {port}", "--duration", "1s"],
            "--duration: between 5s",
        ),
        (["--baseline", "srv {port}", "--candidate", "srv {port}", "--duration", "soon"], "--duration"),
        (["--baseline", "srv {port}", "--candidate", "srv {port}", "--rate", "fast"], "--rate"),
        (
            ["--baseline", "srv {port}", "--candidate", "srv {port}", "--rate", "1/s", "--concurrency", "2"],
            "not allowed",
        ),
        (["--baseline", "srv {port}"], "--candidate"),
        (
            ["--baseline", "srv {port}", "--candidate", "srv {port}", "--max-slowdown", "lots"],
            "--max-slowdown",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_clear_line(capsys, tmp_path, argv, message):
    (tmp_path / "r.json").write_text("{}")
    code, stderr = medic(capsys, *argv, "--requests", str(tmp_path))
    assert code == 2, stderr
    assert message in stderr and "Traceback" not in stderr


def test_a_missing_requests_dir_is_a_usage_error(capsys, tmp_path):
    code, stderr = medic(
        capsys, "--baseline", "srv {port}", "--candidate", "srv {port}", "--requests", str(tmp_path / "none")
    )
    assert code == 2 and "--requests" in stderr and "not a directory" in stderr and "Traceback" not in stderr


def test_an_unwritable_report_path_is_refused_before_anything_starts(capsys, tmp_path):
    (tmp_path / "r.json").write_text("{}")
    code, stderr = medic(
        capsys,
        "--baseline",
        "srv {port}",
        "--candidate",
        "srv {port}",
        "--requests",
        str(tmp_path),
        "--report",
        str(tmp_path / "no" / "such" / "dir.html"),
    )
    assert code == 2 and "--report" in stderr


def _stalled_candidate(start: float, seconds: float, rng: random.Random) -> BuildSeries:
    """RSS that grows 2 MiB a request-second, live bytes flat, while a busy machine stalls the server
    three times (4, 5 and 3 s with no request answered and nothing growing): a staircase on the wall
    clock, whose flat last steps read as growth levelling off."""
    stalls = ((8.0, 4.0), (20.0, 5.0), (26.0, 3.0))
    build = BuildSeries("candidate")
    work = 0.0
    for i in range(int(seconds / 0.25) + 1):
        t, x = start + i * 0.25, i * 0.25
        if i and not any(a <= x < a + length for a, length in stalls):
            work += 0.25
        build.add("rss_bytes", t, 200 * MiB + 2 * MiB * work + rng.gauss(0, 0.3 * MiB))
        build.add("allocator_allocated_bytes", t, 60 * MiB + rng.gauss(0, 0.05 * MiB))
        build.add("cpu_seconds_total", t, 0.001 * work * 20)
        build.answered.append((t, int(work * 20)))
    return build


def test_a_build_stalled_by_a_busy_machine_is_judged_on_the_requests_clock():
    m = _measurement()
    m.builds = (m.builds[0], _stalled_candidate(m.start, m.end - m.start, random.Random(3)))
    verdicts = {v.name: v for v in judge_all(m, Thresholds(), resamples=200)}
    assert verdicts["fragmentation"].failed, verdicts["fragmentation"].summary
    assert not verdicts["leak"].failed
    rss = verdicts["fragmentation"].evidence["candidate_rss"]
    # bytes per wall-clock second: it grew in 18 of the 30 s
    assert 0.9 * MiB < rss["slope_bytes_per_second"] < 1.6 * MiB
