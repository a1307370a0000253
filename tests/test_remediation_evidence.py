"""Evidence before a restart: bounded in time and size, stored privately, the last N kept per instance."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

from remediation.evidence import EvidenceStore, Parts
from remediation.model import InstanceView
from support.procs import PATIENCE

VIEW = InstanceView("serving-7", 4242, 1.0)


def test_captures_are_stored_and_described(tmp_path):
    profile = tmp_path / "jeprof.4242.0.f.heap"
    profile.write_bytes(b"heap_v2/524288\n" + b"x" * 1000)
    store = EvidenceStore(tmp_path / "evidence", timeout=5)
    items = store.capture(
        7,
        VIEW,
        {
            "heap_profile": lambda view, timeout: profile,
            "smaps_rollup": lambda view, timeout: f"Rss: 123 kB\npid {view.pid}\n",
            "class_histogram": lambda view, timeout: [{"class": "byte[]", "bytes": 41 * 2**20}],
            "raw": lambda view, timeout: b"\x00\x01",
        },
        finding={"slope_bytes_per_s": 11_400, "suspect": "tensorflow::Tensor::Tensor"},
    )
    by_name = {i.name: i for i in items}
    assert set(by_name) == {"finding", "heap_profile", "smaps_rollup", "class_histogram", "raw"}
    assert all(i.error is None and not i.truncated for i in items)
    folder = tmp_path / "evidence" / "serving-7" / "00000007"
    assert Path(by_name["heap_profile"].path) == folder / "heap_profile.heap"
    assert Path(by_name["heap_profile"].path).read_bytes() == profile.read_bytes()
    assert "pid 4242" in Path(by_name["smaps_rollup"].path).read_text()
    assert json.loads(Path(by_name["class_histogram"].path).read_text())[0]["class"] == "byte[]"
    assert json.loads(Path(by_name["finding"].path).read_text())["suspect"] == "tensorflow::Tensor::Tensor"
    for item in items:
        assert stat.S_IMODE(os.stat(item.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert by_name["raw"].to_dict()["bytes"] == 2


def test_a_hung_or_failing_capture_does_not_hold_the_restart(tmp_path):
    release = threading.Event()

    def hangs(view, timeout):
        release.wait(30)
        return "late"

    def fails(view, timeout):
        raise RuntimeError("attach refused: DisableAttachMechanism")

    store = EvidenceStore(tmp_path, timeout=0.5)
    started = time.monotonic()
    items = {
        i.name: i for i in store.capture(1, VIEW, {"jvm": hangs, "gdb": fails, "none": lambda v, t: None})
    }
    release.set()
    assert time.monotonic() - started < 2 * PATIENCE
    assert items["jvm"].error == "timed out after 0.5s"
    assert "attach refused" in items["gdb"].error
    assert items["none"].error == "nothing to capture"


def test_size_budget_is_shared_and_truncation_is_marked(tmp_path):
    big = tmp_path / "big.heap"
    big.write_bytes(b"y" * 5000)
    store = EvidenceStore(tmp_path / "ev", max_bytes=3000)
    items = {i.name: i for i in store.capture(1, VIEW, {"a": lambda v, t: "x" * 2000, "b": lambda v, t: big})}
    assert items["a"].size == 2000 and not items["a"].truncated
    assert items["b"].size == 1000 and items["b"].truncated
    assert Path(items["b"].path).stat().st_size == 1000
    assert sum(i.size for i in items.values()) <= 3000


def test_only_the_last_n_restarts_are_kept_per_instance(tmp_path):
    store = EvidenceStore(tmp_path, keep=2)
    for action in (1, 2, 3):
        store.capture(action, VIEW, {"s": lambda v, t: "x"})
    store.capture(9, InstanceView("other", 1, 1.0), {"s": lambda v, t: "x"})
    assert sorted(p.name for p in (tmp_path / "serving-7").iterdir()) == ["00000002", "00000003"]
    assert [p.name for p in (tmp_path / "other").iterdir()] == ["00000009"]
    assert store.take_pruned() == [1] and store.take_pruned() == []  # the ledger drops action 1's list


def test_the_finding_is_kept_whole_as_json_and_parts_are_files_of_their_own(tmp_path):
    (tmp_path / "ev").mkdir(mode=0o755)
    os.chmod(tmp_path / "ev", 0o755)  # left readable by an older medic: tightened
    store = EvidenceStore(tmp_path / "ev")
    finding = {
        "id": "svc:leak:1",
        "kind": "leak",
        "suspects": [{"name": "leak_records"}],
        "evidence": {"x": 1},
    }
    items = store.capture(
        3, VIEW, {"heap_profile": lambda v, t: Parts(sites={"rows": []}, heap=b"heap_v2/65536\n")}, finding
    )
    paths = {i.name: Path(i.path) for i in items if i.path}
    assert paths["finding"].name == "finding.json" and json.loads(paths["finding"].read_text()) == finding
    assert paths["heap_profile.sites"].name == "heap_profile.sites.json"
    assert paths["heap_profile.heap"].read_bytes() == b"heap_v2/65536\n"
    for directory in (tmp_path / "ev", tmp_path / "ev" / "serving-7", paths["finding"].parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in paths.values())


def test_instance_and_capture_names_cannot_escape_the_directory(tmp_path):
    store = EvidenceStore(tmp_path / "ev")
    items = store.capture(1, InstanceView("../../etc", 1, 1.0), {"../passwd": lambda v, t: "x"})
    for item in items:
        assert Path(item.path).resolve().is_relative_to((tmp_path / "ev").resolve())
