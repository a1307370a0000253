"""The fleet simulator runs the real planner and budget, and medic meets what docs/remediation.md promises."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from remediation import budget, planner
from support.remediation import NEEDS_ETCD

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sim():
    spec = importlib.util.spec_from_file_location("fleet_sim", REPO / "benchmarks" / "fleet_sim.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fleet_sim"] = module
    spec.loader.exec_module(module)
    return module


def test_it_drives_the_real_planner_and_budget(sim):
    assert sim.plan is planner.plan and sim.admit is budget.admit and sim.BudgetState is budget.BudgetState


@pytest.mark.parametrize("scenario", ["lockstep", "mixed"])
def test_medic_beats_the_naive_policies_and_keeps_its_budget(sim, scenario):
    cfg = sim.default_config(400, 4, seed=3)
    results = {r.policy: r for r in sim.simulate(scenario, cfg)}
    assert sim.acceptance(list(results.values()), cfg) == []
    medic = results["medic"]
    assert medic.ooms == 0 and medic.restarts_of_healthy == 0
    assert medic.peak_policy_restarts <= cfg.limits.max_concurrent
    assert medic.restarts < results["threshold"].restarts < results["fixed+jitter"].restarts
    assert medic.capacity_lost_pct < results["threshold"].capacity_lost_pct
    assert results["fixed+jitter"].restarts_of_healthy > 0  # the schedule restarts healthy instances too


def test_an_impossible_budget_is_reported_by_the_plans(sim):
    cfg = sim.default_config(400, 3, seed=3, max_concurrent=1)
    cfg = sim.SimConfig(**{**cfg.__dict__, "limits": budget.BudgetLimits(1, 0.0, None, 3600.0)})
    results = {r.policy: r for r in sim.simulate("lockstep", cfg, [sim.Medic, sim.ThresholdWithBudget])}
    medic, fifo = results["medic"], results["threshold+budget"]
    assert medic.infeasible_replans > 0  # said so ahead of time
    assert medic.peak_policy_restarts == 1
    assert medic.ooms <= fifo.ooms  # and still saved at least as many as first-come-first-served


def test_command_line_prints_a_table_and_checks_acceptance(sim, capsys):
    assert sim.main(["--n", "200", "--days", "2", "--scenario", "mixed"]) == 0
    out = capsys.readouterr().out
    assert "scenario mixed: N=200" in out and "acceptance: ok" in out
    for policy in ("medic", "threshold", "threshold+budget", "fixed+jitter"):
        assert f"\n{policy} " in out


@pytest.mark.slow
@NEEDS_ETCD
def test_the_simulators_claims_hold_through_the_elected_planner_on_a_real_etcd():
    """The load benchmark's `--check` on a compressed clock, smaller than its documented 1,000 agents
    (those take minutes here): every leak restarted before its OOM, never more in flight than the
    budget although the leader is killed mid-run, one restart per leaking instance, none for the healthy."""
    argv = [
        sys.executable, "-m", "benchmarks.coordination", "--agents", "41", "--per-process", "20",
        "--seconds", "36", "--interval", "1", "--leaking", "0.3", "--budget", "2", "--speed", "300",
        "--check", "--json",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and result["problems"] == [], result
    assert result["max_in_flight"] <= result["budget"] == 2
    assert result["ooms"] == 0 and result["restarts"] == result["leaking"] > 0
    assert result["failover_seconds"] is not None
