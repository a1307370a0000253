"""Real servers for the notification tests: a webhook target whose behaviour the test switches, and
Prometheus and Alertmanager (Debian packages `prometheus`, `prometheus-alertmanager`) on free
loopback ports with temporary directories. Every process is started through the `spawn` fixture,
so it is killed and reaped at teardown.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from support.procs import REPO, free_port, wait_until

SHIPPED_RULES = REPO / "dashboards" / "prometheus" / "medic-rules.yml"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class HookServer:
    """An HTTP target on 127.0.0.1 that records POSTs. `mode`: ok | error (500) | reject (400) | slow
    | drip (a 500 whose body comes a byte every 0.05 s for `slow_for` seconds).
    `answers`: (status, headers) to give first, one per request, before `mode` applies."""

    port: int = 0
    mode: str = "ok"
    slow_for: float = 3.0
    answers: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    attempts: list[float] = field(default_factory=list)  # every request, answered or not
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HookServer:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                hook.attempts.append(time.time())
                if hook.mode == "slow":
                    time.sleep(hook.slow_for)
                if hook.mode == "drip":
                    try:
                        self.send_response(500)
                        self.end_headers()
                        for _ in range(int(hook.slow_for / 0.05)):
                            self.wfile.write(b".")
                            self.wfile.flush()
                            time.sleep(0.05)
                    except OSError:
                        pass
                    return
                code, headers = (
                    hook.answers.pop(0)
                    if hook.answers
                    else ({"ok": 200, "error": 500, "reject": 400, "slow": 200}[hook.mode], {})
                )
                if code == 200:
                    hook.received.append(
                        Received(
                            self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time()
                        )
                    )
                payload = b"ok" if code == 200 else b"nope"
                try:
                    self.send_response(code)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the client gave up waiting (a timeout test)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def bodies(self) -> list[Any]:
        return [r.json() for r in self.received]


def need(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.skip(f"{binary} not installed: apt-get install -y {package}")
    return path


def wait_http(url: str, timeout: float = 20.0) -> None:
    def ready() -> bool:
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, timeout, 0.1)


@dataclass
class Alertmanager:
    url: str
    proc: subprocess.Popen
    log: Path

    def alerts(self, **params: str) -> list[dict]:
        return httpx.get(f"{self.url}/api/v2/alerts", params=params, timeout=15).json()

    def silences(self) -> list[dict]:
        return httpx.get(f"{self.url}/api/v2/silences", timeout=15).json()

    def active_silences(self) -> list[dict]:
        return [s for s in self.silences() if s["status"]["state"] == "active"]


def start_alertmanager(
    spawn,
    tmp_path: Path,
    webhooks: list[dict],
    name: str = "am",
    group_by: list[str] | None = None,
    inhibit_rules: list[dict] | None = None,
) -> Alertmanager:
    """Alertmanager 0.25 routing every alert to each of `webhooks` (webhook_config dicts), 1 s group
    timers, grouped by `group_by` (default alertname and instance), with `inhibit_rules` if given."""
    binary = need("prometheus-alertmanager", "prometheus-alertmanager")
    home = tmp_path / name
    home.mkdir()
    config: dict[str, Any] = {
        "route": {
            "receiver": "hooks",
            "group_by": group_by or ["alertname", "instance"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "hooks", "webhook_configs": [{"send_resolved": True, **w} for w in webhooks]}],
    }
    if inhibit_rules:
        config["inhibit_rules"] = inhibit_rules
    (home / "am.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = home / "am.log"
    with open(log, "ab") as log_file:  # the child keeps its own copy of the descriptor
        proc = spawn(
            [
                binary,
                f"--config.file={home / 'am.yml'}",
                f"--storage.path={home / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--web.external-url=http://127.0.0.1:{port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/-/ready")
    return Alertmanager(url, proc, log)


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen
    log: Path

    def query(self, expr: str) -> list[dict]:
        body = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=15).json()
        return body["data"]["result"]

    def alerts(self) -> list[dict]:
        return httpx.get(f"{self.url}/api/v1/alerts", timeout=15).json()["data"]["alerts"]


def fast_rules(tmp_path: Path) -> tuple[dict, Path]:
    """The shipped rules with every `for:` at 1 s; the expressions are the shipped ones."""
    rules = yaml.safe_load(SHIPPED_RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "1s"
    path = tmp_path / "medic-rules.fast.yml"
    path.write_text(yaml.safe_dump(rules))
    return rules, path


def firing(prom, name: str) -> list[dict]:
    return [a for a in prom.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"]


def rules_evaluated_after(prom, when: float) -> bool:
    """Whether every rule group was last evaluated after `when` (unix seconds)."""
    groups = httpx.get(f"{prom.url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    return bool(groups) and all(_unix(g["lastEvaluation"]) > when for g in groups)


def _unix(stamp: str) -> float:
    """An RFC 3339 time of Prometheus's API (`2026-12-02T04:05:06.123456789Z`), its fraction dropped."""
    return datetime.fromisoformat(stamp.split(".")[0].removesuffix("Z") + "+00:00").timestamp()


def start_prometheus(
    spawn,
    tmp_path: Path,
    targets: list[str],
    rule_files: list[Path],
    alertmanager: str | list[str] | None,
    jobs: dict[str, list[str]] | None = None,
    metrics_path: str = "/metrics",
) -> Prometheus:
    """Prometheus 2.42 scraping `targets` (host:port) as job `medic` every second, rules evaluated every
    second; `jobs` (job name → targets) replaces that one job, as another scrape setup names them."""
    binary = need("prometheus", "prometheus")
    home = tmp_path / "prom"
    home.mkdir()
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "metrics_path": metrics_path, "static_configs": [{"targets": job_targets}]}
            for job, job_targets in (jobs or {"medic": targets}).items()
        ],
    }
    if alertmanager:
        urls = [alertmanager] if isinstance(alertmanager, str) else alertmanager
        config["alerting"] = {
            "alertmanagers": [
                {
                    "static_configs": [{"targets": [url.removeprefix("http://") for url in urls]}],
                    "api_version": "v2",
                }
            ]
        }
    (home / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = home / "prometheus.log"
    with open(log, "ab") as log_file:  # the child keeps its own copy of the descriptor
        proc = spawn(
            [
                binary,
                f"--config.file={home / 'prometheus.yml'}",
                f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/-/ready", 30)
    return Prometheus(url, proc, log)


class ServedApp:
    """A FastAPI app on a real uvicorn server in a thread, on a free loopback port."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        )
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 10)
        self.client = httpx.Client(base_url=self.url, timeout=10)

    def close(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=5)
        self.sock.close()


# ----------------------------------------------------------------------------- metric names
# the families of the detection wiring (`Telemetry.watch_findings`): the lead signals of the rules
LEAD_METRICS = {
    "medic_time_to_oom_seconds",
    "medic_findings",
    "medic_leak_slope_bytes_per_second",
}
PROMETHEUS_OWN = {"up"}


def exported_metric_names(tmp_path: Path) -> set[str]:
    """Every sample name medic's /metrics can carry: the catalog plus the agent-level families."""
    from agent.api.metrics import Telemetry
    from agent.core.catalog import exported_families
    from agent.notify.metrics import NotifyCollector, ReceiverCollector
    from agent.state.eventlog import EventLog
    from agent.state.store import Store
    from agent.watch.tracker import Tracker

    class NoFindings:
        def open_findings(self) -> list:
            return []

    store = Store(tmp_path / "metrics-state")
    telemetry = Telemetry(Tracker([], store, EventLog(store)))
    telemetry.probe_duration.labels("process").observe(0.001)
    telemetry.watch_findings(NoFindings())
    telemetry.registry.register(NotifyCollector())
    telemetry.registry.register(ReceiverCollector())
    names: set[str] = set()
    suffixes = {"counter": ["_total"], "info": ["_info"], "histogram": ["_bucket", "_count", "_sum"]}
    for family in [*exported_families().values(), *telemetry.registry.collect()]:
        kind = getattr(family, "kind", None) or family.type
        names.update(family.name + s for s in suffixes.get(kind, [""]))
    store.close()
    return names


def metric_names_in(text: str) -> set[str]:
    """`medic_*` and the standard `process_*` metric names (and Prometheus's own `up`) in PromQL expressions."""
    import re

    found = set(re.findall(r"\b(?:medic|process)_[a-z0-9_]+", text))
    found.update(name for name in PROMETHEUS_OWN if re.search(rf"\b{name}\s*(?:\{{|==|!=|[<>])", text))
    return found
