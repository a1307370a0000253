"""`dashboards/prometheus/medic-rules.yml`: promtool check and unit tests, conventions, and metric names."""

from __future__ import annotations

import shutil
import subprocess

import yaml

from agent.notify.event_alerts import PUSHED_ALERTS
from support.notify import LEAD_METRICS, exported_metric_names, metric_names_in, need
from support.procs import REPO

RULES_DIR = REPO / "dashboards" / "prometheus"
RULES = RULES_DIR / "medic-rules.yml"
RULE_TESTS = RULES_DIR / "medic-rules.test.yml"


def promtool(*args: str, cwd=RULES_DIR) -> subprocess.CompletedProcess:
    binary = need("promtool", "prometheus")
    return subprocess.run([binary, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def alerts() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_check_rules():
    result = promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_checks_can_fail(tmp_path):
    broken = RULES.read_text().replace(
        "medic_rss_bytes) / on (job, instance, name)", "medic_rss_bytes) / on (job"
    )
    (tmp_path / "medic-rules.yml").write_text(broken)
    result = promtool("check", "rules", "medic-rules.yml", cwd=tmp_path)
    assert result.returncode == 1 and "MedicMemoryNearLimit" in result.stdout + result.stderr

    loosened = RULES.read_text().replace("medic_memory_limit_bytes > 0.9", "medic_memory_limit_bytes > 0.99")
    (tmp_path / "medic-rules.yml").write_text(loosened)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    result = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert result.returncode == 1 and "MedicMemoryNearLimit" in result.stdout + result.stderr


RUNBOOKS = REPO / "docs" / "runbooks.md"
RUNBOOK_BASE = "https://medic.example.internal/docs/runbooks.md#"


def test_every_alert_has_a_runbook_section_and_names_no_job():
    """A job name ties a rule to one scrape setup; medic targets are known by medic_build_info instead."""
    sections = {
        line.removeprefix("## ").strip().lower(): line
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }
    for rule in alerts():
        name = rule["alert"]
        url = rule["annotations"]["runbook_url"]
        assert url == RUNBOOK_BASE + name.lower(), name
        assert name.lower() in sections, f"docs/runbooks.md has no section for {name}"
        assert "job=" not in rule["expr"].replace(" ", ""), f"{name} names a job"
    body = RUNBOOKS.read_text()
    for heading in sections.values():
        section = body.split(heading, 1)[1].split("\n## ", 1)[0]
        for part in ("**Means.**", "**Check.**", "**Do.**"):
            assert part in section, f"{heading}: no {part}"
    pushed = {name.lower() for name in PUSHED_ALERTS}  # medic's own alerts have their sections too
    assert set(sections) == {rule["alert"].lower() for rule in alerts()} | pushed


def test_every_alert_follows_the_conventions_and_is_unit_tested():
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    for rule in alerts():
        name = rule["alert"]
        assert name.startswith("Medic"), name
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), name
        assert rule["labels"]["source"] == "medic", f"{name}: medic's receiver ignores source=medic"
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert name in tested, f"{name} has no firing case in {RULE_TESTS.name}"


def test_every_metric_in_the_rules_exists(tmp_path):
    used = set()
    for rule in alerts():
        used |= metric_names_in(rule["expr"])
        used |= metric_names_in(" ".join(rule["annotations"].values()))
    known = exported_metric_names(tmp_path) | {"up"}
    assert used - known == set(), f"not exported by medic: {sorted(used - known)}"
    assert {"medic_rss_bytes", "medic_notify_queue_depth", "medic_probe_errors_total", "up"} <= used
    assert used >= LEAD_METRICS, f"rules lost their lead signals: {sorted(LEAD_METRICS - used)}"


def test_the_detection_wiring_exports_the_lead_metrics(tmp_path):
    known = exported_metric_names(tmp_path)
    assert known >= LEAD_METRICS, f"not exported by medic: {sorted(LEAD_METRICS - known)}"


def test_the_metric_check_can_fail(tmp_path):
    """A rule naming a metric medic does not export is caught, not waved through."""
    used = metric_names_in("medic_rss_bytes > 0 and medic_no_such_metric_bytes > 0")
    assert used - (exported_metric_names(tmp_path) | {"up"}) == {"medic_no_such_metric_bytes"}
