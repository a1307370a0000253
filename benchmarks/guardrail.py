"""How often `medic guardrail` cries wolf, and the smallest leak and slowdown it catches.

    python -m benchmarks.guardrail                                   # 20 identical runs of 10m, then the scans
    python -m benchmarks.guardrail --runs 20 --duration 20s --warmup 5s --scan-duration 60s

Every run is a real `medic guardrail` on two real onnxruntime servers (the demo's server with
medic's allocator hook, tests/support/guardrail_server.py) at 16 request pairs a second of 8 rows,
with the default thresholds:

1. false alarms: `--runs` runs of identical builds; any exit status but 0 is a false alarm
   (goal: none), with the verdicts that fired;
2. leak scan: the candidate keeps one request's embedding (128 KiB) in N, for leaks from
   2 MiB/s down; the smallest leak rate (MiB/min) whose run fails with `leak`;
3. slowdown scan: the candidate waits a share of its own service time; the smallest slowdown
   (client-side p50, as the run measured it) whose run fails with `slower`.

Runs one after the other (the machine's two cores are shared), and prints one JSON document with
`--json`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SERVER = REPO / "tests" / "support" / "guardrail_server.py"
ROWS, RATE = 8, 16.0
EMBEDDING = ROWS * 4096 * 4  # bytes one leaking request keeps
LEAK_EVERY = (1, 4, 16, 32, 64, 128, 256, 512)
SLOWER = (0.4, 0.25, 0.18, 0.12, 0.08)


def prepare(root: Path) -> tuple[Path, Path]:
    from agent.demo.load import request_body
    from agent.demo.model import build_model

    model = build_model(root / "model.onnx")
    requests = root / "requests"
    requests.mkdir()
    (requests / "predict.http").write_text(
        "POST /v1/models/demo:predict\nContent-Type: application/json\n\n" + request_body(ROWS, 64).decode()
    )
    return model, requests


def guardrail(
    model: Path, requests: Path, candidate: list[str], duration: str, warmup: str
) -> dict[str, Any]:
    server = f"{sys.executable} {SERVER} --model {model} --port {{port}}"
    started = time.monotonic()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli.main",
            "guardrail",
            "-q",
            "--json",
            "--baseline",
            server,
            "--candidate",
            " ".join([server, *candidate]),
            "--requests",
            str(requests),
            "--duration",
            duration,
            "--warmup",
            warmup,
            "--rate",
            f"{RATE:g}/s",
            "--ready-url",
            "/healthz",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=7200,
    )
    doc = json.loads(out.stdout) if out.stdout.strip() else {}
    return {
        "exit": out.returncode,
        "regressions": doc.get("regressions", []),
        "verdicts": {v["name"]: v for v in doc.get("verdicts", [])},
        "seconds": round(time.monotonic() - started, 1),
        "stderr": out.stderr[-500:] if out.returncode not in (0, 1) else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="identical-build runs (20)")
    parser.add_argument("--duration", default="10m", help="measured time of each identical run (10m)")
    parser.add_argument("--warmup", default="1m", help="warm-up of each run (1m)")
    parser.add_argument("--scan-duration", default="10m", help="measured time of each scan run (10m)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "rate_per_second": RATE,
        "rows": ROWS,
        "duration": args.duration,
        "scan_duration": args.scan_duration,
        "warmup": args.warmup,
    }
    with tempfile.TemporaryDirectory(prefix="medic-guardrail-bench-") as tmp:
        model, requests = prepare(Path(tmp))
        alarms = []
        for i in range(args.runs):
            run = guardrail(model, requests, [], args.duration, args.warmup)
            if run["exit"] != 0:
                alarms.append(
                    {
                        "run": i,
                        "exit": run["exit"],
                        "regressions": run["regressions"],
                        "stderr": run["stderr"],
                    }
                )
            print(
                f"identical {i + 1}/{args.runs}: exit {run['exit']} {run['regressions']} ({run['seconds']}s)",
                file=sys.stderr,
                flush=True,
            )
        report["false_alarms"] = {
            "runs": args.runs,
            "alarms": len(alarms),
            "rate": len(alarms) / max(1, args.runs),
            "details": alarms,
        }
        leaks = []
        for every in LEAK_EVERY:
            run = guardrail(
                model,
                requests,
                ["--behaviour", "leak", "--leak-every", str(every)],
                args.scan_duration,
                args.warmup,
            )
            mib_min = EMBEDDING * RATE / every * 60 / 2**20
            caught = "leak" in run["regressions"]
            leaks.append(
                {"leak_mib_per_min": round(mib_min, 3), "caught": caught, "regressions": run["regressions"]}
            )
            print(
                f"leak {mib_min:.3f} MiB/min: {'caught' if caught else 'missed'} {run['regressions']}",
                file=sys.stderr,
                flush=True,
            )
            if not caught:
                break
        caught_leaks = [x["leak_mib_per_min"] for x in leaks if x["caught"]]
        report["leak_scan"] = {"runs": leaks, "smallest_caught_mib_per_min": min(caught_leaks, default=None)}
        slow = []
        for factor in SLOWER:
            run = guardrail(
                model,
                requests,
                ["--behaviour", "slower", "--slower", str(factor)],
                args.scan_duration,
                args.warmup,
            )
            p50 = run["verdicts"].get("slower", {}).get("evidence", {}).get("p50", {})
            measured = p50.get("ratio", 1.0) - 1
            caught = "slower" in run["regressions"]
            slow.append({"service_share": factor, "p50_slowdown": round(measured, 4), "caught": caught})
            print(
                f"slower {measured:+.1%} (p50): {'caught' if caught else 'missed'}",
                file=sys.stderr,
                flush=True,
            )
            if not caught:
                break
        caught_slow = [x["p50_slowdown"] for x in slow if x["caught"]]
        report["slowdown_scan"] = {"runs": slow, "smallest_caught_p50": min(caught_slow, default=None)}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        fa = report["false_alarms"]
        print(
            f"false alarms: {fa['alarms']}/{fa['runs']} identical runs of {args.duration} ({fa['rate']:.0%})"
        )
        print(
            f"smallest leak caught at {args.scan_duration}: {report['leak_scan']['smallest_caught_mib_per_min']} MiB/min"
        )
        smallest = report["slowdown_scan"]["smallest_caught_p50"]
        print(
            f"smallest slowdown caught at {args.scan_duration}: "
            + (f"{smallest:+.1%} (p50)" if smallest is not None else "none")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
