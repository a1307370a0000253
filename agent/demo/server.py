"""One demo inference server: a real onnxruntime session behind a small HTTP API.

    python -m agent.demo.server --model model.onnx --behaviour leak --port 8601

- `POST /v1/models/demo:predict` with `{"instances": [[f, ...], ...]}` (batch × features floats)
  answers `{"predictions": [[...], ...]}` (batch × classes scores), TensorFlow-Serving style;
- `GET /metrics`: Prometheus exposition with `demo_request_latency_seconds` (histogram) and
  `demo_request_errors_total`, which medic's latency probe scrapes;
- `GET /healthz`: 200 with the behaviour, uptime and the bytes it holds on purpose.

It binds loopback only, prints `ready <port>` once the session is loaded, stops on SIGTERM/SIGINT,
and exits by itself when its parent (the agent that launched it) goes away, so that a demo killed
with SIGKILL leaves no server behind. With `MEDIC_HOOK_SOCKET` set it starts medic's in-process
hook first, as a Python service does, so that medic can trace its allocation sites.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from agent.core.errors import UsageError
from agent.core.units import parse_duration, parse_size
from agent.demo import behaviours
from agent.demo.config import HISTOGRAM

PREDICT_PATH = "/v1/models/demo:predict"
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
MAX_BODY = 8 * 2**20
MAX_BATCH = 4096


def parse_predict_request(body: bytes, features: int, max_batch: int = MAX_BATCH) -> np.ndarray:
    """The rows of a predict request as a float32 array, checked; UsageError says what is wrong."""
    expected = f'expected {{"instances": [[{features} numbers], ...]}} with 1 to {max_batch} rows'
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"request body is not JSON ({exc}); {expected}") from None
    if not isinstance(data, dict) or "instances" not in data:
        raise UsageError(f"request body has no 'instances' key; {expected}")
    rows = data["instances"]
    if not isinstance(rows, list) or not 1 <= len(rows) <= max_batch:
        count = f"{len(rows)} rows" if isinstance(rows, list) else f"a {type(rows).__name__}"
        raise UsageError(f"'instances' must be a list of 1 to {max_batch} rows, got {count}; {expected}")
    for index, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != features:
            got = f"{len(row)} values" if isinstance(row, list) else f"a {type(row).__name__}"
            raise UsageError(f"instances[{index}] must hold {features} numbers, got {got}; {expected}")
    try:
        array = np.array(rows, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise UsageError(f"instances holds something that is not a number; {expected}") from None
    if not np.isfinite(array).all() or np.abs(array).max() > np.finfo(np.float32).max:
        raise UsageError(f"instances holds a value that is not a finite float32 number; {expected}")
    return array.astype(np.float32)


class Model:
    """The onnxruntime session and the behaviour that sees its outputs."""

    def __init__(self, path: str, behaviour: behaviours.Behaviour) -> None:
        import onnxruntime as ort  # type: ignore[import-untyped]  # it ships no py.typed marker

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # the demo shares a small machine with the agent and its peers
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        # without the CPU arena, outputs come straight from malloc, so a leak of outputs grows RSS
        # steadily instead of in the arena's doubling steps
        options.enable_cpu_mem_arena = False
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.features = int(self.session.get_inputs()[0].shape[1])
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.behaviour = behaviour
        self._ort = ort

    def predict(self, rows: np.ndarray) -> list[list[float]]:
        x = self._ort.OrtValue.ortvalue_from_numpy(rows)
        values = self.session.run_with_ort_values(self.outputs, {"x": x})
        named = dict(zip(self.outputs, values))
        self.behaviour.keep(named)
        scores: list[list[float]] = named["scores"].numpy().round(5).tolist()  # a score list per row
        return scores


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, model: Model) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.model = model
        self.started = time.time()
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            HISTOGRAM, "Time to answer a prediction request.", registry=self.registry, buckets=BUCKETS
        )
        self.errors = Counter(
            "demo_request_errors", "Prediction requests that failed.", registry=self.registry
        )
        super().__init__(("127.0.0.1", port), Handler)


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"  # keep-alive, so the load generator reuses its connections
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

    def do_POST(self) -> None:
        if self.path.split("?")[0] != PREDICT_PATH:
            self._drain()
            return self._send(404, {"error": f"unknown path {self.path!r}; POST {PREDICT_PATH}"})
        started = time.perf_counter()
        status = 200
        payload: dict[str, object] = {}
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY:
                raise UsageError(f"Content-Length must be 1 to {MAX_BODY} bytes, got {length}")
            rows = parse_predict_request(self.rfile.read(length), self.server.model.features)
            predictions = self.server.model.predict(rows)
            delay = self.server.model.behaviour.delay()
            if delay:
                time.sleep(delay)
            payload = {"predictions": predictions}
        except (UsageError, ValueError) as exc:
            status, payload = 400, {"error": str(exc)}
        except Exception as exc:  # the server answers 500 and keeps serving
            status, payload = 500, {"error": f"inference failed: {exc}"}
        if status != 200:
            self.server.errors.inc()
        self.server.latency.observe(time.perf_counter() - started)
        self._send(status, payload)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            return self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        if path == "/healthz":
            behaviour = self.server.model.behaviour
            return self._send(
                200,
                {
                    "status": "ok",
                    "behaviour": behaviour.name,
                    "pid": os.getpid(),
                    "uptime_seconds": round(time.time() - self.server.started, 3),
                    "held_bytes": behaviour.held_bytes(),
                },
            )
        self._send(404, {"error": f"unknown path {self.path!r}; try {PREDICT_PATH}, /metrics, /healthz"})

    def _drain(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if 0 < length <= MAX_BODY:
            self.rfile.read(length)

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: object) -> None:
        pass


def _exit_with_parent(server: Server, parent: int, every: float = 0.5) -> None:
    """Stop the server once the process that launched it is gone (we were re-parented)."""
    while os.getppid() == parent:
        time.sleep(every)
    server.shutdown()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agent.demo.server", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the .onnx file (agent.demo.model builds it)")
    parser.add_argument("--behaviour", choices=behaviours.NAMES, default="healthy")
    parser.add_argument("--port", type=int, required=True, help="loopback port; 0 picks a free one")
    parser.add_argument("--leak-cap", default="1Gi", help="leak: stop keeping outputs past this size")
    parser.add_argument("--slow-growth", default="4ms", help="slow: latency added per second of uptime")
    parser.add_argument("--slow-max", default="2s", help="slow: most latency added")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        behaviour = behaviours.create(
            args.behaviour,
            cap=parse_size(args.leak_cap),
            growth=parse_duration(args.slow_growth),
            max_delay=parse_duration(args.slow_max),
        )
    except ValueError as exc:
        print(f"demo server: {exc}", file=sys.stderr)
        return 2
    parent = os.getppid()
    if os.environ.get("MEDIC_HOOK_SOCKET"):
        import medic_hook

        medic_hook.start()
    server = Server(args.port, Model(args.model, behaviour))

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=_exit_with_parent, args=(server, parent), daemon=True).start()
    print(f"ready {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
