"""Evidence before a restart, in a real agent: a C program leaking from `leak_records` under jemalloc
with profiling (and medic's shim) is found leaking; before the restart medic keeps `finding.json`
(the whole finding, naming the suspect), a fresh heap-profile dump whose top site is the leaking
function, smaps_rollup and the series, all private; `medic actions` and `medic evidence` show them."""

from __future__ import annotations

import json
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from support.compressed import DETECT
from support.histo import build_c, clean_env, read_ready
from support.procs import wait_until
from support.workloads import ensure_shim

pytestmark = [pytest.mark.native, pytest.mark.slow]


def test_evidence_of_a_jemalloc_leak_names_the_leaking_function(agent, spawn, tmp_path):
    binary = build_c(tmp_path)
    template = f"{tempfile.mkdtemp(prefix='mh-', dir='/tmp')}/hook.%p.sock"
    env = clean_env(
        LD_PRELOAD=f"libjemalloc.so.2:{ensure_shim()}",
        MEDIC_HOOK_SOCKET=template,
        MALLOC_CONF="prof:true,prof_active:false,lg_prof_sample:16",
    )
    proc = spawn(
        [binary, "256", "100000"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    pid = int(read_ready(proc)[1])
    agent.start(
        {
            "agent": {"interval": "0.2s", "slow_interval": "1s", "flush_interval": "0.3s"},
            "detect": DETECT,
            "remediation": {
                "mode": "enforce",
                "interval": "0.5s",
                "budget": {"min_interval": "0s", "cooldown": "0s", "max_per_hour": None},
                "plan": {"safety_margin": "15s", "restart_duration": "3s", "deadline_granularity": "1s"},
                "blockers": {"min_uptime": "0s"},
                "actuator": {
                    "type": "exec",
                    "command": ["true"],
                },  # keeps the leaker: only the evidence counts
                "verify": {"timeout": "2s", "stable_for": "0.5s"},
            },
            "instances": [
                {
                    "name": "c0",
                    "match": {"pid": pid},
                    "memory_limit": 450 * 2**20,
                    "hook": {"socket": template},
                    "histograms": {"heap_profiles": {"dir": str(tmp_path / "dumps"), "interval": "1s"}},
                }
            ],
        }
    )

    # held until a finding names its suspect: the first heap-profile dumps come after the growth, and a
    # restart taken before them keeps a finding with nothing to name yet (the sites evidence is fresh)
    paused = agent.cli("pause", "--for", "10m", "--reason", "until the suspects are known")
    assert paused.returncode == 0, paused.stderr

    def named() -> bool:
        findings = agent.get("/api/v1/findings", instance="c0")["findings"]
        return any(
            f["kind"] in ("leak", "oom-risk")
            and (f["evidence"].get("suspects") or [{}])[0].get("name") == "leak_records"
            for f in findings
        )

    wait_until(named, 120, interval=0.5)
    assert agent.cli("resume").returncode == 0

    def restarted() -> dict | None:
        actions = agent.get("/api/v1/actions", instance="c0")["actions"]
        return next((a for a in actions if a["action"] == "restart" and a["evidence"]), None)

    action = wait_until(restarted, 120, interval=0.5)
    items = {e["name"]: e for e in action["evidence"]}
    assert {"finding", "heap_profile.sites", "heap_profile.heap", "smaps_rollup", "series"} <= set(items)

    finding = json.loads(Path(items["finding"]["path"]).read_text())
    # the restart acts on the memory finding whose deadline comes first: the leak, or the OOM risk
    # the same growth opens when it is already near the limit; either names what grows
    assert finding["id"] == action["finding_id"] and finding["kind"] in ("leak", "oom-risk")
    assert finding["summary"] and "verdict" in finding and finding["attribution"]
    assert finding["suspects"][0]["name"] == "leak_records"

    sites = json.loads(Path(items["heap_profile.sites"]["path"]).read_text())
    assert sites["source"] == "jemalloc" and sites["rows"][0]["name"] == "leak_records"
    assert Path(items["heap_profile.heap"]["path"]).read_bytes().startswith(b"heap_v2/")

    folder = Path(items["finding"]["path"]).parent
    for directory in (folder, folder.parent, folder.parent.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    for item in (i for i in items.values() if i["path"]):
        assert stat.S_IMODE(Path(item["path"]).stat().st_mode) == 0o600, item

    listed = agent.cli("actions", "c0")
    assert listed.returncode == 0 and str(action["id"]) in listed.stdout
    shown = agent.cli("evidence", str(action["id"]))
    assert shown.returncode == 0, shown.stderr
    assert "heap_profile.sites" in shown.stdout and "suspects: leak_records" in shown.stdout
    item = agent.cli("evidence", str(action["id"]), "finding")
    assert item.returncode == 0 and json.loads(item.stdout)["suspects"][0]["name"] == "leak_records"
    binary_item = agent.cli("evidence", str(action["id"]), "heap_profile.heap")
    assert binary_item.returncode != 0 or binary_item.stdout.startswith("heap_v2/")
    unknown = agent.cli("evidence", "999999")
    assert unknown.returncode != 0 and "no action 999999" in unknown.stderr
    bad = agent.cli("evidence", "abc")
    assert bad.returncode == 2 and "expected an action id" in bad.stderr
