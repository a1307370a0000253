"""A real Prometheus whose past is backfilled: days of series written as OpenMetrics, turned into
TSDB blocks by `promtool tsdb create-blocks-from openmetrics` in the data dir before the server
starts. Used by the history tests and `benchmarks/prometheus_pull.py`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from support.procs import free_port

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
MiB = 2**20


def write_leaking_openmetrics(
    path: Path,
    *,
    instances: int,
    start: float,
    days: float,
    step: float = 60.0,
    base: float = 400 * MiB,
    leak_per_hour: float = 2 * MiB,
    leaking: int | None = None,
    fleet: str = "ranker",
    metric: str = "rss_bytes",
) -> int:
    """`instances` gauges `metric{instance="i-N", fleet=...}` from `start` over `days`, one sample per
    `step`: a daily cycle of ±5 %, and a linear leak in the first `leaking` (default all). Returns
    the number of samples written. OpenMetrics wants the samples of one series together, in time order.
    """
    count = round(days * 86400 / step)
    leaking = instances if leaking is None else leaking
    samples = 0
    with open(path, "w") as out:
        out.write(f"# TYPE {metric} gauge\n")
        for n in range(instances):
            name = f'{metric}{{instance="i-{n}",fleet="{fleet}"}}'
            slope = leak_per_hour / 3600 if n < leaking else 0.0
            lines = []
            for k in range(count):
                ts = start + k * step
                phase = (ts % 86400) / 86400
                value = (
                    base * (1 + 0.05 * _cycle(phase)) + slope * (ts - start) + (n * 7919 + k * 104729) % 997
                )
                lines.append(f"{name} {value:.0f} {ts:.0f}\n")
            out.writelines(lines)
            samples += count
        out.write("# EOF\n")
    return samples


def _cycle(phase: float) -> float:
    import math

    return math.sin(2 * math.pi * phase)


def backfill(openmetrics: Path, data_dir: Path) -> None:
    """Blocks from the OpenMetrics file into `data_dir` (before the server starts on it)."""
    if PROMTOOL is None:
        import pytest

        pytest.skip("promtool not installed: apt-get install -y prometheus")
    data_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            PROMTOOL,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=24h",
            str(openmetrics),
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if done.returncode != 0:
        raise AssertionError(f"promtool failed ({done.returncode}): {done.stderr[-2000:]}")


@contextmanager
def prometheus_with_history(openmetrics: Path | None, workdir: Path | None = None) -> Iterator[str]:
    """Prometheus 2.42 on a free loopback port, its TSDB backfilled from `openmetrics` (None: empty);
    scrapes nothing; keeps 400 days. Yields its URL; stopped by pid after."""
    if PROMETHEUS is None:
        import pytest

        pytest.skip("prometheus not installed: apt-get install -y prometheus")
    home = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="medic-prom-"))
    owned = workdir is None
    data = home / "data"
    if openmetrics is not None:
        backfill(openmetrics, data)
    (home / "prometheus.yml").write_text("global: {scrape_interval: 1m}\nscrape_configs: []\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(home / "prometheus.log", "ab")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={data}",
            "--storage.tsdb.retention.time=400d",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {(home / 'prometheus.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("prometheus not ready within 60s")
            time.sleep(0.2)
        yield url
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        if owned:
            shutil.rmtree(home, ignore_errors=True)
