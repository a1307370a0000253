"""History from a real Prometheus: its past backfilled with `promtool tsdb create-blocks-from
openmetrics` (four days of a leaking fleet), pulled through `/api/v1/query_range` in chunks, by
the agent's history job and by `medic analyze --prometheus`. An unreachable, slow or garbled
server, an error answer or a bound passed means "no history", said once, never a crash.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent.cli.main import main
from agent.config.history import PrometheusHistorySection
from agent.config.model import Config
from agent.core.errors import SeriesFormatError, UnsafePath
from agent.detect.memory.priors import PriorBook
from agent.detect.params import DetectParams
from agent.jobs.history import HistoryJob, history_spec
from agent.series.prometheus_pull import PullSpec, chunks, pull_range
from agent.state.eventlog import EventLog
from agent.state.store import Store
from support.history import prometheus_with_history, write_leaking_openmetrics
from support.procs import PATIENCE, free_port, wait_until
from support.remediation import HttpRecorder, silent_server

MiB = 2**20
DAYS = 4
NOW = (time.time() // 3600) * 3600  # the backfill ends at the top of this hour
START = NOW - DAYS * 86400
INSTANCES = 4


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> str:
    home = tmp_path_factory.mktemp("prom-history")
    openmetrics = home / "history.om"
    write_leaking_openmetrics(openmetrics, instances=INSTANCES, start=START, days=DAYS, leaking=2)
    with prometheus_with_history(openmetrics, home / "server") as url:
        yield url


def matrix(*series: tuple[dict, list]) -> dict:
    return {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{"metric": m, "values": v} for m, v in series]},
    }


def spec(url: str, **kw) -> PullSpec:
    return PullSpec(
        url=url,
        query=kw.pop("query", "rss_bytes"),
        start=kw.pop("start", START),
        end=kw.pop("end", NOW),
        **kw,
    )


def events_of(store: Store, kind: str) -> list:
    return [e for e in store.events(limit=1000) if e.kind == kind]


# ----------------------------------------------------------------------------- chunks
@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(1_600_000_000, 1_800_000_000),
    span=st.integers(0, 30 * 86400),
    step=st.sampled_from([1, 15, 60, 300, 3600]),
    points=st.integers(1, 11_000),
)
def test_chunks_cover_the_grid_once(start, span, step, points):
    pieces = chunks(start, start + span, step, points)
    grid = []
    for first, last in pieces:
        assert last - first <= step * (points - 1)
        grid.extend(first + k * step for k in range(int((last - first) // step) + 1))
    expected = [start + k * step for k in range(span // step + 1)]
    assert grid == expected


# ----------------------------------------------------------------------------- real Prometheus
@pytest.mark.slow
def test_a_pull_reads_every_backfilled_sample_in_chunks(prometheus):
    done: list = []
    result = pull_range(spec(prometheus, chunk_points=500), progress=lambda d, t: done.append((d, t)))
    assert len(done) == done[-1][1] > 10  # many chunks
    instances = result.instances()
    assert [s.instance for s in instances] == [f"i-{n}" for n in range(INSTANCES)]
    for series in instances:
        points = series.series["rss_bytes"]
        times = [t for t, _ in points]
        assert times == sorted(set(times))  # no sample read twice across chunks
        assert len(points) >= DAYS * 1440
    assert result.labels["i-0"]["fleet"] == "ranker"
    leak = instances[0].series["rss_bytes"]
    flat = instances[3].series["rss_bytes"]
    # the same phase of the daily cycle, three days apart: 2 MiB/h of leak in i-0, none in i-3
    assert leak[3 * 1440][1] - leak[0][1] == pytest.approx(72 * 2 * MiB, rel=0.02)
    assert abs(flat[3 * 1440][1] - flat[0][1]) < MiB


@pytest.mark.slow
def test_a_bad_query_says_what_prometheus_said(prometheus):
    with pytest.raises(SeriesFormatError, match=r"HTTP 400: bad_data: .*parse error"):
        pull_range(spec(prometheus, query="rss_bytes{"))


@pytest.mark.slow
def test_bounds_in_samples_and_bytes(prometheus):
    with pytest.raises(SeriesFormatError, match="over 1000 samples"):
        pull_range(spec(prometheus, max_samples=1000))
    with pytest.raises(SeriesFormatError, match="over the 20000-byte bound"):
        pull_range(spec(prometheus, max_bytes=20_000))


@pytest.mark.slow
def test_the_history_job_offers_profiles_and_says_once_when_it_cannot(prometheus, tmp_path):
    store = Store(tmp_path / "state")
    try:
        events = EventLog(store)
        book = PriorBook()
        good = PrometheusHistorySection(url=prometheus, query="rss_bytes", lookback="4d")
        job = HistoryJob(good, events, DetectParams(), book)
        assert job.run(now=NOW) == 1
        assert book.get("ranker") is not None and book.get("ranker").lifetimes >= 1
        assert len(events_of(store, "history_loaded")) == 1
        down = PrometheusHistorySection(url=f"http://127.0.0.1:{free_port()}", query="rss_bytes")
        job.section = down
        assert job.run(now=NOW) == 0 and job.run(now=NOW) == 0
        assert book.get("ranker") is None  # the history it gave before is dropped with it
        unavailable = events_of(store, "history_unavailable")
        assert len(unavailable) == 1 and "cannot reach Prometheus" in unavailable[0].message
        job.section = good
        job.tick(now=NOW)  # the first tick pulls at once
        assert book.get("ranker") is not None and len(events_of(store, "history_loaded")) == 2
        job.section = down
        job.tick(now=NOW + 3600)  # not due again before `refresh`: nothing asked
        assert book.get("ranker") is not None and len(events_of(store, "history_unavailable")) == 1
    finally:
        store.close()


@pytest.mark.slow
def test_medic_analyze_reads_from_prometheus(prometheus, capsys):
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(START))
    code = main(
        ["analyze", "--prometheus", prometheus, "--query", "rss_bytes", "--start", start, "--end", str(int(NOW)),
         "--limit", "700Mi", "--json"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    kinds = {i["instance"]: {f["kind"] for f in i["findings"]} for i in doc["instances"]}
    assert set(kinds) == {f"i-{n}" for n in range(INSTANCES)}
    assert kinds["i-0"] & {"leak", "oom-risk"} and kinds["i-1"] & {"leak", "oom-risk"}
    assert not kinds["i-2"] and not kinds["i-3"]


def test_medic_analyze_usage_errors(capsys):
    assert main(["analyze"]) == 2
    assert "--prometheus URL" in capsys.readouterr().err
    assert main(["analyze", "--prometheus", "http://127.0.0.1:9"]) == 2
    assert "needs --query" in capsys.readouterr().err
    assert (
        main(["analyze", "--prometheus", f"http://127.0.0.1:{free_port()}", "--query", "x", "--start", "1d"])
        == 2
    )
    assert "cannot reach Prometheus" in capsys.readouterr().err


# ----------------------------------------------------------------------------- failing servers
def test_unreachable_and_slow_servers_are_errors_not_hangs():
    with pytest.raises(SeriesFormatError, match="cannot reach Prometheus"):
        pull_range(spec(f"http://127.0.0.1:{free_port()}"))
    with silent_server() as url:
        started = time.monotonic()
        with pytest.raises(SeriesFormatError, match=r"no answer within 0\.5s"):
            pull_range(spec(url, timeout=0.5))
        assert time.monotonic() - started < 5 * PATIENCE


def test_a_pull_over_its_deadline_stops():
    with HttpRecorder() as server:
        server.respond("/api/v1/query_range", 200, matrix(), delay=0.3)
        with pytest.raises(SeriesFormatError, match=r"over its 0\.5s deadline"):
            pull_range(spec(server.url, deadline=0.5, chunk_points=100))


def test_the_bearer_token_and_headers_are_sent(tmp_path):
    token = tmp_path / "prom.token"
    token.write_text("tok-0123456789abcdef\n")
    token.chmod(0o600)
    section = PrometheusHistorySection(
        url="http://127.0.0.1:1", query="up", bearer_token_file=token, headers={"X-Scope-OrgID": "team-a"}
    )
    with HttpRecorder() as server:
        server.respond(
            "/api/v1/query_range", 200, matrix(({"__name__": "rss_bytes", "instance": "a"}, [[START, "1"]]))
        )
        pulled = pull_range(
            history_spec(section.model_copy(update={"url": server.url, "lookback": 3600}), NOW)
        )
        assert pulled.points == 1  # one chunk
        headers = server.requests[0]["headers"]
        assert (
            headers["Authorization"] == "Bearer tok-0123456789abcdef" and headers["X-Scope-OrgID"] == "team-a"
        )
    token.chmod(0o644)
    with pytest.raises(UnsafePath, match="chmod 600"):
        history_spec(section, NOW)


def test_series_without_a_name_get_the_configured_metric():
    with HttpRecorder() as server:
        server.respond(
            "/api/v1/query_range", 200, matrix(({"pod": "p-1"}, [[START, "5"], [START + 60, "6"]]))
        )
        result = pull_range(spec(server.url, metric="rss_bytes", end=START + 60))
        assert result.series == {"p-1": {"rss_bytes": [(START, 5.0), (START + 60, 6.0)]}}


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (200, b"<html>not prometheus</html>", "not JSON"),
        (
            200,
            b'{"status": "success", "data": {"resultType": "vector", "result": []}}',
            "resultType is 'vector'",
        ),
        (503, b"overloaded", "HTTP 503"),
        (
            422,
            b'{"status":"error","errorType":"execution","error":"query timed out"}',
            "execution: query timed out",
        ),
    ],
)
def test_garbage_answers_are_clear_errors(status, body, message):
    with HttpRecorder() as server:
        server.respond("/api/v1/query_range", status, body)
        with pytest.raises(SeriesFormatError, match=message):
            pull_range(spec(server.url))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        st.binary(max_size=300),
        st.recursive(
            st.none() | st.text(max_size=5) | st.integers(),
            lambda c: (
                st.lists(c, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["status", "data", "resultType", "result", "metric", "values"]),
                    c,
                    max_size=4,
                )
            ),
            max_leaves=20,
        ).map(lambda d: json.dumps(d).encode()),
    )
)
def test_fuzz_any_answer_gives_a_result_or_a_series_error(body):
    with HttpRecorder() as server:
        server.respond("/api/v1/query_range", 200, body)
        try:
            pull_range(spec(server.url, start=START, end=START + 600))
        except SeriesFormatError:
            pass


# ----------------------------------------------------------------------------- config
def test_the_history_section_is_checked():
    cfg = Config.model_validate({"history": {"prometheus": {"url": "http://p:9090", "query": "rss_bytes"}}})
    assert cfg.history.prometheus.lookback == 8 * 86400 and cfg.history.prometheus.step == 60
    assert Config.model_validate({}).history.prometheus is None
    bad = [
        ({"url": "ftp://p", "query": "x"}, "http:// or https://"),
        ({"url": "http://p", "query": ""}, "at least 1 character"),
        ({"url": "http://p", "query": "x", "lookback": "10m"}, "between 1h and 90d"),
        ({"url": "http://p", "query": "x", "tls": {"ca_file": "/ca.pem"}}, "not https://"),
        ({"url": "http://p", "query": "x", "headers": {"X-A": "a\r\nB: c"}}, "one line"),
        (
            {"url": "http://p", "query": "x", "bearer_token_file": "/t", "headers": {"authorization": "x"}},
            "not both",
        ),
        ({"url": "https://p", "query": "x", "tls": {"key_file": "/k"}}, "go together"),
    ]
    for section, message in bad:
        with pytest.raises(ValidationError, match=message):
            Config.model_validate({"history": {"prometheus": section}})


def test_tls_files_are_checked_like_other_secrets(tmp_path: Path):
    section = PrometheusHistorySection(
        url="https://p:9090", query="x", tls={"ca_file": tmp_path / "none.pem"}
    )
    with pytest.raises(Exception, match=r"history\.prometheus\.tls\.ca_file: .*does not exist"):
        history_spec(section, NOW)


@pytest.mark.slow
def test_a_real_agent_reads_its_history_at_start(prometheus, spawn, tmp_path):
    from support.agent_runner import AgentRunner

    agent = AgentRunner(spawn, tmp_path)
    history = {"prometheus": {"url": prometheus, "query": "rss_bytes", "lookback": "4d"}}
    try:
        agent.start({"history": history})
        wait_until(lambda: [e for e in agent.events() if e["kind"] == "history_loaded"], 60)
        [loaded] = [e for e in agent.events() if e["kind"] == "history_loaded"]
        assert (
            f"of {INSTANCES} instances" in loaded["message"]
            and "profiles for 1 of 1 workloads" in loaded["message"]
        )
    finally:
        agent.close()


@pytest.mark.slow
def test_a_real_agent_without_prometheus_says_so_once_and_runs(spawn, tmp_path):
    from support.agent_runner import AgentRunner

    agent = AgentRunner(spawn, tmp_path)
    history = {"prometheus": {"url": f"http://127.0.0.1:{free_port()}", "query": "rss_bytes"}}
    try:
        agent.start({"history": history})
        wait_until(lambda: [e for e in agent.events() if e["kind"] == "history_unavailable"], 60)
        time.sleep(6)  # another tick: not due again, and nothing said twice
        unavailable = [e for e in agent.events() if e["kind"] == "history_unavailable"]
        assert len(unavailable) == 1 and unavailable[0]["severity"] == "warning"
        assert agent.get("/healthz") is not None and agent.proc.poll() is None
    finally:
        agent.close()
