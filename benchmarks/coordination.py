"""Coordination load against a real etcd: N agents, each a real `Engine` with its own `EtcdCoordinator`.

    python -m benchmarks.coordination --agents 1000 --seconds 60 --json
    python -m benchmarks.coordination --agents 1000 --seconds 90 --speed 300 --check

Agents run many per process (`--per-process`), each with its own lease, fleet entry and
SQLite ledger, stepped every `--interval` seconds at its own phase. Their instances are simulated
(a pid and a start time; a managed restart gives a new one): N real processes do not fit two cores.
Agent 0 runs alone in the first process and starts first, so it is the first leader; at two thirds
of the run that process is killed (SIGKILL) and the time until another agent holds the leader key is
the failover. The first third of the run (after every agent's first two steps) is quiet (no
finding: the steady state; make it at least two fleet-TTL thirds long so that keepalives are in it); then `--leaking` of the
instances get a leak finding whose deadline (the projected OOM) is spread over the rest of the run.

Reported: etcd's memory per agent (its RSS, Go heap in use and backend size, after the run less
before the first agent), etcd requests and bytes per second as etcd counts them (`/metrics`: gRPC calls started,
which the JSON gateway's requests become, and gRPC bytes both ways) over the whole run after start-up
and over the quiet third (`steady_requests_per_agent_second`), the p99 of one engine step, the p99
grant latency (a restart's start minus its planned slot), the failover, and the most restarts in
flight at once (from the coordinator's own records) against the budget.

`--speed K` compresses the engine's clock K times (deadlines, budget intervals and slots are in
compressed seconds; etcd's leases stay real): `--check` then re-checks the fleet simulator's claims
with coordination in the loop (every leak restarted before its OOM where the budget allows it, peak
in flight within the budget across the failover, one restart per leaking instance, none for the
healthy, starts spread rather than bunched) and exits 1 if one fails.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

METRICS = ("grpc_server_started_total", "etcd_network_client_grpc_received_bytes_total",
           "etcd_network_client_grpc_sent_bytes_total")  # fmt: skip
# etcd's memory: the process, the Go heap in use (what the keys, leases, watches and revisions hold)
# and the backend's size (keys and their revisions kept until a compaction)
GAUGES = ("process_resident_memory_bytes", "go_memstats_heap_inuse_bytes", "etcd_mvcc_db_total_size_in_bytes",
          "etcd_debugging_mvcc_keys_total")  # fmt: skip


def etcd_counters(url: str) -> dict[str, float]:
    """Sums of etcd's request and byte counters, from its `/metrics`."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=5).text
    sums = dict.fromkeys(METRICS + GAUGES, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in sums:
            sums[name] += float(line.rsplit(" ", 1)[1])
        if name == METRICS[0] and 'grpc_method="' in line:
            method = "call:" + line.split('grpc_method="', 1)[1].split('"', 1)[0]
            sums[method] = sums.get(method, 0.0) + float(line.rsplit(" ", 1)[1])
    return sums


def config(args: argparse.Namespace, budget: int, namespace: str) -> dict:
    speed = args.speed
    return {
        "mode": "enforce",
        "interval": f"{args.interval * speed}s",
        "budget": {"max_concurrent": budget, "min_interval": "0s", "max_per_hour": None, "cooldown": "1h"},
        "plan": {
            # more than a failover (lease TTL + a step) and a restart: a leader killed does not cost an OOM
            "safety_margin": f"{(args.lease_ttl + 2 * args.interval + args.restart) * speed}s",
            # a slot is free again for the next agent only at the leader's and that agent's next steps
            "restart_duration": f"{max(args.restart, 2 * args.interval) * speed}s",
            "deadline_granularity": f"{max(1.0, args.interval * speed)}s",
        },
        "blockers": {"min_uptime": 0, "capacity": {"max_unavailable": 10_000}},
        "verify": {"timeout": "60s", "stable_for": f"{args.restart}s"},
        "evidence": {"enabled": False},
        "coordinator": {"namespace": namespace, "lease_ttl": f"{args.lease_ttl}s", "fleet_ttl": f"{args.fleet_ttl}s"},
    }  # fmt: skip


# ----------------------------------------------------------------------------- one worker process
def worker(spec: dict) -> dict:
    """Step `spec["agents"]` engines until `spec["end"]`; return their step and grant figures."""
    from agent.core.records import ProcessIdentity
    from agent.state.eventlog import EventLog
    from agent.state.store import Store
    from remediation.config import RemediationSection
    from remediation.coordinator.etcd import EtcdCoordinator
    from remediation.engine import Engine, EngineHooks
    from remediation.model import InstanceView, RemediationRequest

    t0, speed = spec["t0"], spec["speed"]

    def sim_clock() -> float:  # the engine's compressed clock
        return t0 + (time.time() - t0) * speed

    section = RemediationSection.model_validate(spec["config"])
    workdir = Path(spec["workdir"])
    processes: dict[str, ProcessIdentity] = {}
    next_pid = [spec["first_pid"]]

    def launch(name: str) -> int:
        next_pid[0] += 1
        processes[name] = ProcessIdentity(next_pid[0], time.time())
        return next_pid[0]

    agents = []
    for index, leak in spec["agents"]:
        name = f"i{index:05d}"
        launch(name)
        store = Store(workdir / f"agent-{index:05d}")
        coordinator = EtcdCoordinator(
            [spec["url"]], namespace=section.coordinator.namespace, timeout=5.0, clock=sim_clock
        )
        engine = Engine(
            section,
            store=store,
            events=EventLog(store),
            coordinator=coordinator,
            agent_id=f"agent-{index:05d}",
            state_dir=store.dir,
            hooks=EngineHooks(
                locate=lambda n: processes.get(n), managed_restart=lambda n, timeout: launch(n)
            ),
            clock=sim_clock,
        )
        agents.append(
            {"name": name, "engine": engine, "coordinator": coordinator, "store": store, "leak": leak}
        )
    steps: list[float] = []
    latencies: list[float] = []
    outcomes: list[dict] = []
    queue = [(spec["start"] + spec["interval"] * i / len(agents), i) for i in range(len(agents))]
    heapq.heapify(queue)
    first_round = set(range(len(agents)))
    while queue:
        due, i = heapq.heappop(queue)
        if due >= spec["end"]:
            continue
        time.sleep(max(0.0, due - time.time()))
        agent = agents[i]
        name, leak = agent["name"], agent["leak"]
        now = sim_clock()
        proc = processes[name]
        requests = []
        if leak and time.time() >= leak["at"] and proc.start_time < leak["at"]:
            if now >= leak["deadline"]:  # not restarted in time: the OOM kill restarts it
                outcomes.append({"instance": name, "oom_at": now})
                launch(name)
            else:
                requests.append(
                    RemediationRequest(name, "leak", f"leak-{name}", "heap grows", leak["deadline"])
                )
        view = InstanceView(name, proc.pid, proc.start_time, labels={"fleet": "bench"}, managed=True)
        started = time.perf_counter()
        report = agent["engine"].step(now, requests, [view])
        steps.append(time.perf_counter() - started)
        if name in report.started:
            entry = report.plan.entry(name)
            slot = entry.slot_at if entry else now
            latencies.append(max(0.0, now - slot) / speed)
            outcomes.append(
                {"instance": name, "started_at": now, "slot_at": slot, "deadline": leak and leak["deadline"]}
            )
        heapq.heappush(queue, (due + spec["interval"], i))
        if first_round:
            first_round.discard(i)
            if not first_round:  # every agent has its lease and entry: the steady state can begin
                Path(spec["ready"]).touch()
    for agent in agents:
        agent["engine"].close(timeout=2)
        agent["coordinator"].close()
        agent["store"].close()
    return {"steps": steps, "latencies": latencies, "outcomes": outcomes}


# ----------------------------------------------------------------------------- the run
def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def max_in_flight(records: list) -> int:
    """The most restarts whose [start, end) overlap, from the coordinator's records."""
    events = []
    for r in records:
        events += [(r.started_at, 1), ((r.finished_at if r.finished_at is not None else math.inf), -1)]
    peak = current = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        current += delta
        peak = max(peak, current)
    return peak


def run(args: argparse.Namespace, url: str) -> dict:
    """Start the workers, measure, collect; workers still running at the end (an error) are killed."""
    procs: list[subprocess.Popen] = []
    shm = Path("/dev/shm")  # the agents' ledgers in memory: the disk's fsyncs are not what is measured
    workdir = Path(tempfile.mkdtemp(prefix="medic-coord-bench-", dir=shm if shm.is_dir() else None))
    try:
        return _run(args, url, procs, workdir)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _run(args: argparse.Namespace, url: str, procs: list[subprocess.Popen], workdir: Path) -> dict:
    from remediation.coordinator.etcd import EtcdCoordinator

    n = args.agents
    before = etcd_counters(url)  # etcd's memory before any agent
    budget = args.budget or max(1, n // 200)
    namespace = f"bench{uuid.uuid4().hex[:6]}"
    rng = random.Random(args.seed)
    t0 = time.time()
    warmup = 10.0 + n * 0.15  # processes start, import, open their ledgers and clients (busy 2 cores)
    start = t0 + warmup
    settle = start + 2 * args.interval + 1  # every agent has made its first writes
    quiet_end = settle + args.seconds / 3
    kill_at = settle + 2 * args.seconds / 3
    end = settle + args.seconds
    speed = args.speed
    leaks = {}
    for index in rng.sample(range(n), int(n * args.leaking)):
        seen = rng.uniform(quiet_end, quiet_end + args.seconds / 6)
        deadline_real = rng.uniform(seen + args.seconds / 4, end)  # restarted within the run
        leaks[index] = {"at": seen, "deadline": t0 + (deadline_real - t0) * speed}
    cfg = config(args, budget, namespace)
    groups = [[0]] + [list(range(i, min(n, i + args.per_process))) for i in range(1, n, args.per_process)]
    outputs = []
    client = EtcdCoordinator([url], namespace=namespace)
    for number, group in enumerate(groups):
        spec = {
            "url": url, "config": cfg, "t0": t0, "speed": speed, "start": start, "end": end,
            "interval": args.interval, "workdir": str(workdir), "first_pid": 10_000_000 * (number + 1),
            "agents": [(i, leaks.get(i)) for i in group], "ready": str(workdir / f"worker-{number}.ready"),
        }  # fmt: skip
        out = workdir / f"worker-{number}.json"
        outputs.append(out)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.coordination", "--worker", json.dumps(spec), "--out", str(out)],
                cwd=REPO, env=env, start_new_session=True,
            )
        )  # fmt: skip
        if number == 0:  # agent 0 leads: wait for its first step
            while client.gateway.get(client.base + "control/leader") is None and time.time() < start + 10:
                time.sleep(0.05)
    time.sleep(max(0.0, settle - time.time()))
    while not all((workdir / f"worker-{i}.ready").exists() for i in range(len(groups))):
        if time.time() > quiet_end - 5:
            raise SystemExit(
                "the agents did not all make their first step in time: fewer --agents, or more --per-process"
            )
        time.sleep(0.1)
    first = etcd_counters(url)
    began = time.time()
    startup_late = began - settle
    time.sleep(max(0.0, quiet_end - time.time()))
    quiet = etcd_counters(url)
    quiet_seconds = time.time() - began
    time.sleep(max(0.0, kill_at - time.time()))
    old = client.gateway.get(client.base + "control/leader")
    killed_at = time.time()
    os.killpg(procs[0].pid, signal.SIGKILL)
    failover = None
    while time.time() < end:
        new = client.gateway.get(client.base + "control/leader")
        if new is not None and (old is None or new["create_revision"] != old["create_revision"]):
            failover = time.time() - killed_at
            break
        time.sleep(0.02)
    time.sleep(max(0.0, end - time.time()))
    last = etcd_counters(url)
    seconds = time.time() - began
    for proc in procs:
        proc.wait(timeout=120 + n / 10)
    steps, latencies, outcomes = [], [], []
    for number, out in enumerate(outputs[1:], start=1):
        if not out.exists():
            raise SystemExit(
                f"worker {number} exited with {procs[number].returncode} and no figures (see above)"
            )
        data = json.loads(out.read_text())
        steps += data["steps"]
        latencies += data["latencies"]
        outcomes += data["outcomes"]
    records = client.restarts(since=0)
    client.close()
    requests = last[METRICS[0]] - first[METRICS[0]]
    moved = sum(last[m] - first[m] for m in METRICS[1:])
    steady = (quiet[METRICS[0]] - first[METRICS[0]]) / quiet_seconds
    result = {
        "agents": n,
        "etcd_requests_per_second": round(requests / seconds, 1),
        "etcd_bytes_per_second": round(moved / seconds),
        "step_p99_seconds": percentile(steps, 0.99),
        "grant_latency_p99_seconds": percentile(latencies, 0.99),
        "failover_seconds": round(failover, 2) if failover is not None else None,
        "max_in_flight": max_in_flight(records),
        "budget": budget,
        "steady_requests_per_agent_second": round(steady / n, 4),
        "steady_requests_by_call": {
            k[5:]: round((quiet[k] - first.get(k, 0.0)) / quiet_seconds, 2)
            for k in quiet
            if k.startswith("call:") and quiet[k] > first.get(k, 0.0)
        },
        "requests_per_agent_second": round(requests / seconds / n, 4),
        "interval_seconds": args.interval,
        "lease_ttl_seconds": args.lease_ttl,
        "fleet_ttl_seconds": args.fleet_ttl,
        "speed": speed,
        "leaking": len(leaks),
        "restarts": sum(1 for o in outcomes if "started_at" in o),
        "ooms": sum(1 for o in outcomes if "oom_at" in o),
        "late_starts": sum(
            1 for o in outcomes if o.get("deadline") and o.get("started_at", 0) > o["deadline"]
        ),
        "restarted_healthy": sum(
            1 for o in outcomes if "started_at" in o and int(o["instance"][1:]) not in leaks
        ),
        "restarted_twice": sum(1 for c in _counts(outcomes).values() if c > 1),
        "etcd_rss_mib": [round(before[GAUGES[0]] / 2**20, 1), round(last[GAUGES[0]] / 2**20, 1)],
        "etcd_rss_per_agent_kib": round((last[GAUGES[0]] - before[GAUGES[0]]) / n / 1024, 1),
        "etcd_heap_inuse_per_agent_kib": round((last[GAUGES[1]] - before[GAUGES[1]]) / n / 1024, 1),
        "etcd_db_per_agent_kib": round((last[GAUGES[2]] - before[GAUGES[2]]) / n / 1024, 1),
        "etcd_keys_per_agent": round((last[GAUGES[3]] - before[GAUGES[3]]) / n, 2),
        "run_seconds": round(seconds, 1),
        "quiet_seconds": round(quiet_seconds, 1),
        "startup_late_seconds": round(startup_late, 1),
        "per_process": args.per_process,
    }
    result["problems"] = check(result) if args.check else []
    return result


def _counts(outcomes: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outcomes:
        if "started_at" in o:
            counts[o["instance"]] = counts.get(o["instance"], 0) + 1
    return counts


def check(r: dict) -> list[str]:
    """The fleet simulator's claims, with the elected planner on etcd in the loop."""
    problems = []
    if r["max_in_flight"] > r["budget"]:
        problems.append(f"{r['max_in_flight']} restarts in flight at once, over the budget of {r['budget']}")
    if r["ooms"]:
        problems.append(f"{r['ooms']} instance(s) reached their OOM before being restarted")
    if r["restarted_healthy"] or r["restarted_twice"]:
        problems.append(
            f"{r['restarted_healthy']} healthy and {r['restarted_twice']} twice-restarted instances"
        )
    if r["restarts"] < r["leaking"]:
        problems.append(f"only {r['restarts']} of {r['leaking']} leaking instances were restarted")
    if r["failover_seconds"] is None:
        problems.append("no new leader after the leader was killed")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=2.0, help="engine step, real seconds")
    parser.add_argument("--lease-ttl", type=float, default=5.0, help="leader key and restart slot TTL")
    parser.add_argument(
        "--fleet-ttl", type=float, default=30.0, help="fleet entry TTL (kept alive every third)"
    )
    parser.add_argument(
        "--restart", type=float, default=0.5, help="a simulated restart's verify time, real s"
    )
    parser.add_argument("--leaking", type=float, default=0.02, help="share of instances that get a leak")
    parser.add_argument("--budget", type=int, help="max_concurrent (default N/200, at least 1)")
    parser.add_argument("--per-process", type=int, default=250)
    parser.add_argument("--speed", type=float, default=1.0, help="engine clock compression")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--etcd", help="an etcd client URL (default: start one on loopback)")
    parser.add_argument("--check", action="store_true", help="exit 1 unless the simulator's claims hold")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        Path(args.out).write_text(json.dumps(worker(json.loads(args.worker))))
        return 0
    if args.agents < 2 or args.seconds <= 0 or args.interval <= 0 or args.per_process < 1 or args.speed <= 0:
        parser.error("--agents must be at least 2; --seconds, --interval, --per-process and --speed positive")
    if min(args.lease_ttl, args.fleet_ttl) < 2 or not 0 <= args.leaking <= 1 or (args.budget or 1) < 1:
        parser.error("--lease-ttl and --fleet-ttl must be at least 2 s (etcd's minimum), --leaking in [0, 1]")
    with ExitStack() as stack:
        if args.etcd:
            url = args.etcd
        else:
            from support.remediation import etcd_server

            url = stack.enter_context(etcd_server())
        result = run(args, url)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:36} {value}")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
