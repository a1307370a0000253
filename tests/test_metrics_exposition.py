"""`/metrics` as scrapers read it: content negotiation, gzip, no `_created` series, and the bodies
accepted by the real tools (promtool for the text format, Prometheus itself for OpenMetrics)."""

from __future__ import annotations

import gzip
import re
import subprocess

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from support.notify import need, start_prometheus
from support.procs import wait_until

pytestmark = pytest.mark.slow
FAST = {"interval": "0.2s", "slow_interval": "1s", "discovery_interval": "0.5s", "flush_interval": "0.3s"}
# the Accept headers Prometheus sends by default: 2.x, then 3.x
PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"


def scrape(url: str, accept: str, encoding: str = "identity") -> tuple[httpx.Headers, bytes]:
    """The raw answer, not decoded: httpx would otherwise gunzip it silently."""
    with httpx.stream("GET", f"{url}/metrics", headers={"Accept": accept, "Accept-Encoding": encoding}) as r:
        r.raise_for_status()
        return r.headers, b"".join(r.iter_raw())


def series(body: str) -> list[str]:
    """Sample names and labels, without values: two scrapes differ only in those."""
    return [line.rsplit(" ", 1)[0] for line in body.splitlines() if line and not line.startswith("#")]


def start_agent(agent, workload) -> None:
    stable = workload("stable", "--size", "8Mi")
    agent.start({"agent": FAST, "instances": [{"name": "stable", "match": {"pid": stable.pid}}]})

    def probed() -> bool:
        page = agent.get("/metrics")
        return 'medic_rss_bytes{name="stable"}' in page and "medic_probe_duration_seconds_count" in page

    wait_until(probed, 20)


def promtool_check(body: bytes) -> subprocess.CompletedProcess:
    binary = need("promtool", "prometheus")
    return subprocess.run([binary, "check", "metrics"], input=body, capture_output=True, timeout=30)


def test_formats_gzip_and_no_created_series(agent, workload):
    start_agent(agent, workload)

    headers, text = scrape(agent.url, "*/*")
    assert headers["content-type"] == TEXT
    assert "content-encoding" not in headers
    families = {f.name: f for f in parse_text(text.decode())}
    assert families["medic_probe_duration_seconds"].type == "histogram"
    assert not re.search(rb"^\S+_created[{ ]", text, re.M), text.decode()
    checked = promtool_check(text)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    assert b"error" not in checked.stdout.lower() + checked.stderr.lower()

    for accept in (PROMETHEUS_2, PROMETHEUS_3, "application/openmetrics-text; version=1.0.0"):
        headers, body = scrape(agent.url, accept)
        assert headers["content-type"].startswith(OPENMETRICS), (accept, headers["content-type"])
        assert body.endswith(b"# EOF\n")
        assert not re.search(rb"^\S+_created[{ ]", body, re.M), body.decode()
        families = {f.name: f for f in parse_openmetrics(body.decode())}  # strict: refuses malformed pages
        assert families["medic_probe_duration_seconds"].type == "histogram"
        assert families["medic_instance"].type == "info"
        assert {s.name for s in families["medic_probe_duration_seconds"].samples} == {
            "medic_probe_duration_seconds_bucket",
            "medic_probe_duration_seconds_count",
            "medic_probe_duration_seconds_sum",
        }

    for accept in ("*/*", PROMETHEUS_2):
        plain_headers, plain = scrape(agent.url, accept)
        headers, zipped = scrape(agent.url, accept, "gzip, deflate")
        assert headers["content-encoding"] == "gzip"
        assert headers["content-type"] == plain_headers["content-type"]
        assert "Accept-Encoding" in headers["vary"]
        assert series(gzip.decompress(zipped).decode()) == series(plain.decode())


def test_probe_health_only_for_probes_with_figures_and_one_start_time(agent, workload):
    """A plain process has no latency source and is no JVM: those probes have no health to tell of
    it; the process's start time is one series, the catalog's."""
    start_agent(agent, workload)
    page = agent.get("/metrics")
    for probe in ("process", "cgroup"):
        assert f'medic_probe_errors_total{{name="stable",probe="{probe}"}} 0.0' in page, probe
        assert f'medic_probe_last_success_timestamp_seconds{{name="stable",probe="{probe}"}}' in page
    for probe in ("latency", "canary", "jvm"):
        assert f'name="stable",probe="{probe}"' not in page, probe
    assert 'medic_process_start_time_seconds{name="stable"}' in page
    assert "medic_instance_start_time_seconds" not in page


def test_promtool_reads_openmetrics_only_as_text():
    """Why Prometheus itself checks the OpenMetrics page below: `promtool check metrics` parses the
    text format alone, so any OpenMetrics page with an info family is an error to it."""
    page = b'# TYPE medic_build info\nmedic_build_info{version="1"} 1\n# EOF\n'
    assert promtool_check(page).returncode != 0


def test_prometheus_scrapes_openmetrics_gzipped(agent, workload, spawn, tmp_path):
    """Prometheus asks for OpenMetrics and gzip: its strict parser takes the page, no `_created` series."""
    start_agent(agent, workload)
    prom = start_prometheus(spawn, tmp_path, [agent.url.removeprefix("http://")], [], None)

    def scraped() -> list[dict]:
        targets = httpx.get(f"{prom.url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        return [t for t in targets if t["lastScrape"] != "0001-01-01T00:00:00Z" and t["health"] != "unknown"]

    wait_until(lambda: scraped() and prom.query('medic_instance_up{name="stable"}'), 30)
    (target,) = scraped()
    assert target["health"] == "up" and target["lastError"] == "", target
    assert prom.query('medic_probe_duration_seconds_count{probe="process"}')
    assert prom.query('{__name__=~".+_created"}') == []


def test_standard_names_quantile_label_counters_and_no_pid(agent, workload, spawn):
    """The agent's own process as `process_*`, latency quantiles as one family with a `quantile`
    label, request and error counters instead of rates, an info family without the pid; promtool
    reads the page without a complaint."""
    from support.latency_app import start_app

    app = start_app(spawn, "--mode", "healthy", "--base", "0.005", "--load", "40")
    stable = workload("stable", "--size", "8Mi")
    latency = {
        "prometheus": {
            "url": app.url("/metrics"),
            "histogram": "request_latency_seconds",
            "labels": {"route": "/work"},
            "requests_counter": "requests",
            "errors_counter": "request_errors",
        }
    }
    agent.start(
        {
            "agent": FAST,
            "instances": [
                {"name": "stable", "match": {"pid": stable.pid}},
                {"name": "served", "match": {"pid": app.proc.pid}, "latency": latency},
            ],
        }
    )

    def counted() -> dict | None:
        families = {f.name: f for f in parse_text(agent.get("/metrics"))}
        requests = families.get("medic_requests")
        return families if requests and requests.samples and requests.samples[0].value > 20 else None

    families = wait_until(counted, 30, interval=0.3)
    quantiles = {s.labels["quantile"] for s in families["medic_latency_seconds"].samples}
    assert quantiles == {"0.5", "0.9", "0.99", "0.999"}
    assert all(s.labels["name"] == "served" for s in families["medic_latency_seconds"].samples)
    assert families["medic_requests"].type == "counter" and families["medic_errors"].type == "counter"
    first = families["medic_requests"].samples[0].value
    later = wait_until(
        lambda: (
            (v := {f.name: f for f in parse_text(agent.get("/metrics"))}["medic_requests"].samples[0].value)
            > first
            and v
        ),
        15,
        interval=0.3,
    )
    assert later > first, "a counter only goes up"
    names = {s.name for f in families.values() for s in f.samples}
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"} <= names
    assert not [n for n in names if n.startswith("medic_agent_") or n.endswith(("_rate", "_ratio"))]
    assert not [n for n in names if re.fullmatch(r"medic_latency_p\d+_seconds", n)]
    for sample in families["medic_instance_info"].samples:  # the text format names it with _info
        assert "pid" not in sample.labels and sample.labels["mode"] == "attached"

    assert families["medic_latency_seconds"].type == "summary"
    _, text = scrape(agent.url, "*/*")
    checked = promtool_check(text)
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    _, page = scrape(agent.url, PROMETHEUS_2)
    strict = {f.name: f for f in parse_openmetrics(page.decode())}
    assert strict["medic_latency_seconds"].type == "summary" and strict["medic_requests"].type == "counter"
