"""The API never traces, measures or logs requests through OpenTelemetry (FastAPI 0.165 does it by
default once a global provider exists): a provider set up in the agent's process, by an
auto-instrumentation wrapper say, is never asked for a tracer, a meter or a logger."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support.procs import REPO

SCRIPT = r"""
import json, os, sys, tempfile
from pathlib import Path
from opentelemetry import metrics, trace
from opentelemetry import _logs

asked = []

class Tracers(trace.TracerProvider):
    def get_tracer(self, *args, **kwargs):
        asked.append("tracer")
        return trace.NoOpTracer()

class Meters(metrics.MeterProvider):
    def get_meter(self, name, *args, **kwargs):
        asked.append("meter")
        return metrics.NoOpMeter(name)

class Loggers(_logs.LoggerProvider):
    def get_logger(self, name, *args, **kwargs):
        asked.append("logger")
        return _logs.NoOpLogger(name)

trace.set_tracer_provider(Tracers())
metrics.set_meter_provider(Meters())
_logs.set_logger_provider(Loggers())
sys.path.insert(0, sys.argv[1])
from support.http_guard import World

world = World(Path(tempfile.mkdtemp()), os.getpid())
statuses = [world.request("GET", path).status_code for path in ("/healthz", "/metrics", "/api/v1/instances")]
world.close()
print(json.dumps({"statuses": statuses, "asked": asked}))
"""


def test_a_global_opentelemetry_provider_is_never_used():
    env = {
        **os.environ,
        "FASTAPI_OTEL_AUTO_CONFIGURE": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(REPO / "tests")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["statuses"] == [200, 200, 200]
    assert answer["asked"] == []


def test_a_fastapi_without_the_telemetry_option_gets_none(monkeypatch):
    """FastAPI before 0.165 (pyproject allows 0.110 on) has no `telemetry` parameter; it is not passed.
    A stand-in class with an older signature, as no older FastAPI is installed here."""
    import fastapi

    from agent.api import app as app_module

    class OlderFastAPI(fastapi.FastAPI):
        def __init__(self, *, title: str = "", version: str = "", docs_url=None, redoc_url=None) -> None:
            super().__init__(title=title, version=version, docs_url=docs_url, redoc_url=redoc_url)

    assert app_module._without_opentelemetry() == {"telemetry": app_module.NO_OPENTELEMETRY}
    monkeypatch.setattr(app_module, "FastAPI", OlderFastAPI)
    assert app_module._without_opentelemetry() == {}
