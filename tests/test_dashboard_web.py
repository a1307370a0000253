"""The web dashboard, for real: a real agent on a leaking workload serves the page, real headless
Chromium renders it, and the tests read the rendered DOM (and a screenshot). HTTP tests check the
security headers, the content types and that no path reaches outside `dashboards/web/`.

The "agent unreachable" test drives Chromium over the DevTools protocol on a pipe (no extra
library): the page is loaded from a live agent, the agent is stopped, and the page must say so.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.api.dashboard import CONTENT_SECURITY_POLICY, WEB_DIR, dashboard_routes, static_files
from support.agent_runner import AgentRunner
from support.browser import Dom, chromium_argv, dump_dom, needs_chromium, run_chromium
from support.procs import PYTHON, reap, wait_until, workload_argv

LIMIT = 200 * 2**20
HOSTILE = '<img src=x id=pwned onerror="document.title=1"><b id=bold>bold</b>'
# Compressed time (see tests/test_agent_detection.py): 4 MiB/s against a 200 MiB limit is about 40 s
# from OOM, so the detector needs only ~8 s of history; the leak stops at its cap just under the limit.
CONFIG = {
    # compressed 2x, so the page must say so: the detectors see 6 s, 12 s, 1 s, 2 s and 30 min
    "agent": {"interval": "0.2s", "slow_interval": "2s", "flush_interval": "0.3s", "time_scale": 2},
    "detect": {
        "interval": "0.5s",
        "memory": {"window": "12s", "long_window": "24s", "warmup": "2s", "season": "4s", "horizon": "1h"},
    },
    "instances": [
        {
            "name": "leaky",
            "match": {
                "command": workload_argv("leak", "--rate", "4Mi", "--every", "0.05s", "--cap", "170Mi")
            },
            "memory_limit": LIMIT,
        },
        {
            "name": "stable",
            "match": {"command": workload_argv("stable", "--size", "16Mi")},
            "memory_limit": LIMIT,
        },
    ],
}

# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def leaking_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentRunner]:
    """One real agent for the module, watching a leaking and a stable workload; reaped at the end."""
    children: list[subprocess.Popen] = []

    def spawn(argv: list[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)
        children.append(subprocess.Popen(argv, **kwargs))
        return children[-1]

    runner = AgentRunner(spawn, tmp_path_factory.mktemp("dashboard-agent"))
    runner.start(CONFIG)
    yield runner
    runner.close()  # SIGTERM (the agent stops the workloads it launched), then kills what is left
    for proc in children:
        reap(proc)


def wait_for_leak(agent: AgentRunner) -> dict:
    findings = wait_until(lambda: agent.get("/api/v1/findings", kind="leak")["findings"], 45, 0.2)
    return findings[0]


# ---------------------------------------------------------------------------------------- HTTP


@pytest.mark.slow
def test_page_and_files_carry_strict_headers_and_types(leaking_agent: AgentRunner) -> None:
    expected = {
        "/": "text/html",
        "/dashboard": "text/html",
        "/static/app.js": "text/javascript",
        "/static/style.css": "text/css",
    }
    for path, media_type in expected.items():
        response = httpx.get(leaking_agent.url + path, timeout=5)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["content-type"].startswith(media_type), path
        assert response.headers["x-content-type-options"] == "nosniff"
        csp = response.headers["content-security-policy"]
        assert csp == CONTENT_SECURITY_POLICY
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe" not in csp
        assert "frame-ancestors 'none'" in csp
    page = Dom(httpx.get(leaking_agent.url + "/", timeout=5).text)
    scripts = page.find("script")
    assert scripts and all(s["attrs"].get("src", "").startswith("/static/") for s in scripts)
    assert all(not s["text"].strip() for s in scripts), "no inline script"
    assert not [e for e in page.elements if any(k.startswith("on") or k == "style" for k in e["attrs"])]
    assert httpx.head(leaking_agent.url + "/static/app.js", timeout=5).status_code == 200


def raw_get(url: str, path: str, redirects: int = 0) -> tuple[int, bytes]:
    """GET exactly `path` (http.client sends it unnormalised, as an attacker would); follow up to
    `redirects` same-host redirects (a trailing-slash redirect must lead nowhere either)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        status, body, location = response.status, response.read(), response.getheader("location")
    finally:
        conn.close()
    if status in (301, 302, 307, 308) and redirects > 0 and location:
        target = urlsplit(location)
        assert target.netloc in ("", parts.netloc), f"{path} redirects off the agent: {location}"
        return raw_get(url, target.path + (f"?{target.query}" if target.query else ""), redirects - 1)
    return status, body


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [
        "/static/../agent/auth.py",
        "/static/..%2fagent%2fauth.py",
        "/static/%2e%2e/%2e%2e/agent/auth.py",
        "/static/..%2F..%2Fpyproject.toml",
        "/static/..",
        "/static/%2e%2e",
        "/static/",
        "/static/nope.js",
        "/static/app.js%00.png",
        "/static/.gitignore",
        "/static//etc/passwd",
        "/dashboard/../agent/auth.py",
    ],
)
def test_unknown_and_traversal_paths_are_404(leaking_agent: AgentRunner, path: str) -> None:
    status, body = raw_get(leaking_agent.url, path, redirects=3)
    assert status == 404, (path, body[:200])
    assert b"TokenGuard" not in body and b"[project]" not in body and b"root:" not in body


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.lists(
        st.sampled_from([*"./\\%2eEfF:a~ _-", "app.js", "style.css", "index.html", "..", "%2f", "%2e"]),
        max_size=8,
    ).map("".join)
)
def test_only_the_listed_files_are_ever_served(leaking_agent: AgentRunner, name: str) -> None:
    files = static_files()
    status, body = raw_get(leaking_agent.url, "/static/" + quote(name, safe="/%.~:\\"), redirects=3)
    if status == 200:
        served = [path for path in files.values() if path.read_bytes() == body]
        assert served, f"/static/{name!r} served bytes that are not a dashboard file"
    else:
        assert status in (400, 404), (name, status)  # 400: a malformed escape the server refuses


def test_static_table_lists_only_plain_files_of_known_types(tmp_path: Path) -> None:
    (tmp_path / "page.js").write_text("1")
    (tmp_path / ".secret.js").write_text("2")
    (tmp_path / "notes.txt").write_text("3")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.js").write_text("4")
    assert list(static_files(tmp_path)) == ["page.js"]
    assert static_files(tmp_path / "missing") == {}
    assert {"index.html", "app.js", "style.css"} <= set(static_files(WEB_DIR))


def test_missing_files_say_what_to_do(tmp_path: Path) -> None:
    from fastapi import FastAPI

    from support.notify import ServedApp

    app = FastAPI()
    app.include_router(dashboard_routes(tmp_path / "missing"))
    served = ServedApp(app)  # a real uvicorn server in a thread
    try:
        response = served.client.get("/")
    finally:
        served.close()
    assert response.status_code == 404
    assert "missing" in response.json()["error"] and "reinstall medic" in response.json()["error"]
    assert response.headers["x-content-type-options"] == "nosniff"


# ---------------------------------------------------------------------------------------- rendering


def open_hostile_alert(agent: AgentRunner) -> None:
    """An Alertmanager alert whose summary is HTML: it becomes an `external` finding of leaky."""
    token = (agent.state_dir / "admin.token").read_text().strip()
    alert = {
        "status": "firing",
        "labels": {"alertname": "Injected", "instance": "leaky", "severity": "page"},
        "annotations": {"summary": HOSTILE},
        "startsAt": "2026-11-29T11:37:29Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.example/graph",
        "fingerprint": "d45b0a4d",
    }
    payload = {
        "version": "4",
        "status": "firing",
        "receiver": "medic",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.example",
        "groupKey": "{}:{}",
        "alerts": [alert],
    }
    response = httpx.post(
        f"{agent.url}/api/v1/alertmanager",
        content=json.dumps(payload),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=5,
    )
    assert response.status_code == 200, response.text


@pytest.mark.slow
@needs_chromium
def test_rendered_page_shows_fleet_chart_limit_projection_and_findings(
    leaking_agent: AgentRunner, tmp_path: Path
) -> None:
    leak = wait_for_leak(leaking_agent)
    open_hostile_alert(leaking_agent)
    started = time.monotonic()
    dom = Dom(dump_dom(leaking_agent.url + "/", tmp_path / "profile"))
    elapsed = time.monotonic() - started

    rows = {r["attrs"]["data-instance"]: r for r in dom.find("tr", "instance-row")}
    assert set(rows) == {"leaky", "stable"}
    assert "up" in rows["stable"]["text"] and "none" in rows["stable"]["text"]
    assert "leak" in rows["leaky"]["text"] and "200.0 MiB" in rows["leaky"]["text"]
    assert "selected" in rows["leaky"]["attrs"]["class"], "the instance with findings is shown first"
    assert len(dom.find("svg", "bar")) == 2

    chart = dom.find("svg", "chart-memory")
    assert len(chart) == 1 and "leaky" in chart[0]["text"]
    rss = dom.find("polyline", "series-rss")
    points = [tuple(map(float, p.split(","))) for p in rss[0]["attrs"]["points"].split()]
    assert len(points) >= 4  # ~8 s of samples in 1.8 s buckets (a 1 h window holds at most 2000 points)
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    assert xs == sorted(xs) and ys[-1] < ys[0], "RSS rises (SVG y grows downwards)"
    limit = dom.find("line", "limit")
    assert len(limit) == 1 and limit[0]["attrs"]["y1"] == limit[0]["attrs"]["y2"]
    assert float(limit[0]["attrs"]["y1"]) < min(ys), "the limit line is above the RSS line"
    assert any(t["text"].startswith("limit 200.0 MiB") for t in dom.find("text", "limit-label"))
    projection = dom.find("line", "projection")
    assert len(projection) == 1
    assert float(projection[0]["attrs"]["y2"]) < float(projection[0]["attrs"]["y1"]), "projection rises"
    oom_labels = [t["text"] for t in dom.find("text", "oom-label")]
    assert oom_labels[0].startswith("OOM ") and oom_labels[1].startswith("in "), oom_labels
    tto = dom.find("td", "tto", within=rows["leaky"])[0]["text"]
    assert re.fullmatch(r"\d+s|\dm \d+s", tto), tto  # about 40 s from OOM when the finding opens
    assert dom.find("td", "tto", within=rows["stable"])[0]["text"] == "–"

    cards = {c["attrs"]["data-kind"]: c for c in dom.find("article", "finding")}
    assert "leak" in cards and "external" in cards
    summaries = [e["text"] for e in dom.find("p", "summary")]
    leak_summary = dom.find("p", "summary", within=cards["leak"])[0]["text"]
    # the figures move with every judgement; the shape is the API's own summary
    assert leak["summary"].startswith("leaky leaks ") and leak_summary.startswith("leaky leaks ")
    assert re.search(r"projected OOM in .+ against 200\.0 MiB; confidence", leak_summary), leak_summary
    assert "confidence" in cards["leak"]["text"] and "/h" in cards["leak"]["text"]

    # API text is text: the hostile summary shows literally and creates no element
    assert HOSTILE in summaries
    assert not dom.find(id="pwned") and not dom.find(id="bold")

    assert dom.find("span", "pill-ok")[0]["text"] == "connected"
    assert dom.find("div", id="banner")[0]["attrs"].get("hidden") is not None
    time_scale = dom.find("div", id="time-scale")[0]
    assert time_scale["attrs"].get("hidden") is None, "a compressed clock is said on the page"
    assert time_scale["text"].startswith("Compressed time: 2x — detection windows and deadlines are scaled")
    event_rows = dom.find("table", "events")
    assert event_rows and "finding_opened" in event_rows[0]["text"]
    assert "dry-run" in dom.find("span", id="mode")[0]["text"]
    remediation_state = dom.find("div", id="remediation-state")[0]["text"]
    assert "not paused" in remediation_state
    assert "this agent (no other agent shares its coordinator)" in remediation_state  # the planner
    print(f"dump-dom took {elapsed:.2f}s")


@pytest.mark.slow
@needs_chromium
def test_screenshot_for_a_person_to_look_at(leaking_agent: AgentRunner, tmp_path: Path) -> None:
    wait_for_leak(leaking_agent)
    shot = tmp_path / "dashboard.png"
    done = run_chromium(
        chromium_argv(
            tmp_path / "profile",
            "--virtual-time-budget=4000",
            "--window-size=1280,2200",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            leaking_agent.url + "/dashboard",
        )
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
    if os.environ.get("MEDIC_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["MEDIC_KEEP_SCREENSHOT"])


# ---------------------------------------------------------------------------------------- unreachable


class DevTools:
    """Chromium driven over `--remote-debugging-pipe`: JSON messages separated by NUL on fds 3 and 4."""

    def __init__(self, profile: Path) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        launcher = (
            "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
            "os.execv(sys.argv[3], sys.argv[3:])"
        )
        argv = chromium_argv(profile, "--remote-debugging-pipe", "about:blank")
        self.proc = subprocess.Popen(
            [PYTHON, "-c", launcher, str(to_chrome_r), str(from_chrome_w), *argv],
            pass_fds=(to_chrome_r, from_chrome_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.session: str | None = None
        self.events: list[dict] = []  # what the page reported meanwhile (Log, Runtime)

    def call(self, method: str, params: dict | None = None, timeout: float = 10.0) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply["result"]
            if "method" in reply:
                self.events.append(reply)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise AssertionError("no answer from chromium over the DevTools pipe")
            chunk = os.read(self._from_chrome, 65536)
            if not chunk:
                raise AssertionError("chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Log.enable")
        self.call("Runtime.enable")

    def page_errors(self) -> list[str]:
        """Uncaught exceptions and Content-Security-Policy violations the page reported."""
        found = []
        for event in self.events:
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                found.append(str(params.get("exceptionDetails", {}).get("exception", {}).get("description")))
            elif event["method"] == "Log.entryAdded" and params["entry"].get("source") in (
                "security",
                "javascript",
            ):
                found.append(params["entry"].get("text", ""))
        return found

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float) -> object:
        return wait_until(lambda: self.evaluate(expression), timeout, 0.1)

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=3)
        except (AssertionError, OSError):
            pass
        reap(self.proc)
        os.close(self._to_chrome)
        os.close(self._from_chrome)


@pytest.mark.slow
@needs_chromium
def test_page_says_when_the_agent_goes_away_and_keeps_the_last_data(agent, tmp_path: Path) -> None:
    agent.start(
        {
            "agent": {"interval": "0.2s", "flush_interval": "0.3s"},
            "instances": [{"name": "solo", "match": {"command": workload_argv("stable", "--size", "8Mi")}}],
        }
    )
    wait_until(lambda: agent.instance("solo")["status"] == "up", 15)
    browser = DevTools(tmp_path / "profile")
    try:
        browser.open(agent.url + "/?refresh=0.5")
        browser.wait_for("document.querySelectorAll('#fleet tr[data-instance=\"solo\"]').length === 1", 15)
        assert browser.evaluate("document.getElementById('banner').hidden") is True
        assert browser.evaluate("document.getElementById('time-scale').hidden") is True  # real time
        assert browser.evaluate("document.getElementById('agent-state').textContent") == "connected"

        agent.stop()  # the API really goes away
        assert agent.proc is not None and agent.proc.poll() is not None
        banner = browser.wait_for(
            "(() => { const b = document.getElementById('banner');"
            " return b.hidden ? null : b.textContent; })()",
            10,
        )
        assert str(banner).startswith("Agent unreachable since"), banner
        assert "/api/v1/instances: connection failed" in str(banner)
        assert browser.evaluate("document.getElementById('agent-state').textContent") == "unreachable"
        assert browser.evaluate("document.body.classList.contains('stale')") is True
        assert browser.evaluate("document.querySelectorAll('#fleet tr[data-instance=\"solo\"]').length") == 1
        assert browser.evaluate("document.querySelector('svg.chart-memory polyline') !== null") is True
        assert browser.page_errors() == []
    finally:
        browser.close()
