"""docs/metrics.md lists every metric `/metrics` can carry, and nothing it does not."""

from __future__ import annotations

import re

from support.notify import exported_metric_names
from support.procs import REPO

DOC = REPO / "docs" / "metrics.md"
HISTOGRAM_PARTS = ("_bucket", "_count", "_sum")


def documented() -> set[str]:
    """Metric names in the first column of the tables, the "Renamed" section left out."""
    text = DOC.read_text().split("\n## Renamed", 1)[0]
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names.update(re.findall(r"`((?:medic|process)_[a-z0-9_]+)`", first))
    return names


def families(tmp_path) -> set[str]:
    """Exported sample names, a histogram's parts folded into its name."""
    out = set()
    for name in exported_metric_names(tmp_path):
        base = next((name.removesuffix(p) for p in HISTOGRAM_PARTS if name.endswith(p)), name)
        out.add(base if f"{base}_bucket" in exported_metric_names(tmp_path) else name)
    return out


def test_every_exported_metric_is_documented_and_every_documented_one_exported(tmp_path):
    exported, doc = families(tmp_path), documented()
    assert exported - doc == set(), f"not in docs/metrics.md: {sorted(exported - doc)}"
    assert doc - exported == set(), f"documented but not exported: {sorted(doc - exported)}"


def test_the_renamed_metrics_are_gone(tmp_path):
    exported = exported_metric_names(tmp_path)
    assert not {n for n in exported if n.startswith("medic_agent_process_")}
    assert (
        not {"medic_request_rate", "medic_error_rate", "medic_error_ratio", "medic_latency_p99_seconds"}
        & exported
    )
    assert {
        "medic_latency_seconds",
        "medic_requests_total",
        "medic_errors_total",
        "process_cpu_seconds_total",
    } <= exported
