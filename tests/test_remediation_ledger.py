"""The ledger's cases on a real SQLite store: which restart a new finding inherits, and state dirs
written by an older medic (without the restart's deadline and finding) opened and upgraded in place."""

from __future__ import annotations

import sqlite3

import pytest

from agent.state.store import Store
from remediation.ledger import Ledger
from remediation.model import RemediationRequest

T0 = 1_700_000_000.0
WINDOW = 600.0  # clear_check: how long after a restart a new finding inherits it


@pytest.fixture
def ledger(tmp_path):
    store = Store(tmp_path / "state")
    yield Ledger(store)
    store.close()


def finding(kind: str, finding_id: str, deadline: float | None = None) -> RemediationRequest:
    return RemediationRequest("svc", kind, finding_id, "x", deadline=deadline)  # type: ignore[arg-type]


def restart_for(ledger: Ledger, kind: str, finding_id: str, deadline: float | None, at: float) -> None:
    """What the engine records when the restart made for this finding was verified."""
    ledger.touch_case(finding(kind, finding_id, deadline), at - 100, WINDOW)
    ledger.update_case(
        "svc",
        finding_id,
        restarted_at=at,
        restart_outcome="succeeded",
        restart_deadline=deadline,
        restart_finding=finding_id,
    )


INHERITANCE = [
    # (restarted kind, new kind, seconds after the restart, inherits?)
    ("oom-risk", "oom-risk", 30, True),
    ("oom-risk", "leak", 30, True),  # one restart answers both
    ("leak", "oom-risk", 30, True),
    ("leak", "leak", WINDOW + 1, False),  # long after the restart: a case of its own
    ("slow", "slow", 30, True),
    ("slow", "leak", 30, False),  # another problem
    ("leak", "slow", 30, False),
    ("fragmentation", "fragmentation", 30, True),
]


@pytest.mark.parametrize("restarted, kind, after, inherits", INHERITANCE)
def test_a_new_finding_inherits_a_recent_restart_of_its_kind(ledger, restarted, kind, after, inherits):
    restart_for(ledger, restarted, "OLD", T0 + 3600, T0)
    case = ledger.touch_case(finding(kind, "NEW", T0 + 9000), T0 + after, WINDOW)
    if inherits:
        assert (case.restarted_at, case.restart_outcome) == (T0, "succeeded")
        assert (case.restart_deadline, case.restart_finding) == (T0 + 3600, "OLD")
        assert case.after_restart
    else:
        assert (case.restarted_at, case.restart_deadline, case.restart_finding) == (None, None, None)
        assert not case.after_restart


def test_the_restarted_finding_itself_is_not_after_its_restart(ledger):
    restart_for(ledger, "leak", "OLD", T0 + 3600, T0)
    case = ledger.touch_case(finding("leak", "OLD", T0 + 3600), T0 + 30, WINDOW)
    assert case.restarted_at == T0 and not case.after_restart


def test_a_person_clearing_the_escalation_forgets_the_restart(ledger):
    restart_for(ledger, "leak", "OLD", T0 + 3600, T0)
    ledger.touch_case(finding("leak", "NEW", T0 + 4000), T0 + 30, WINDOW)
    ledger.escalate("svc", "restart-did-not-help", "x", "NEW", 1, T0 + 31)
    assert ledger.clear_escalation("svc", reset_history=True)
    case = ledger.case("svc", "NEW")
    assert (case.restarted_at, case.restart_deadline, case.restart_finding) == (None, None, None)


OLD_CASES_TABLE = """
CREATE TABLE remediation_cases (
    instance TEXT NOT NULL, finding_id TEXT NOT NULL, kind TEXT NOT NULL,
    first_seen REAL NOT NULL, last_seen REAL NOT NULL, closed_at REAL,
    purged_at REAL, purge_result TEXT, restarted_at REAL, restart_outcome TEXT, escalated_at REAL,
    PRIMARY KEY (instance, finding_id));
INSERT INTO remediation_cases (instance, finding_id, kind, first_seen, last_seen, restarted_at, restart_outcome)
    VALUES ('svc', 'OLD', 'leak', 1699999000, 1699999900, 1700000000, 'succeeded');
"""


def test_a_state_dir_from_an_older_medic_is_upgraded_in_place(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    with sqlite3.connect(state / "medic.db") as db:
        db.executescript(OLD_CASES_TABLE)
    store = Store(state)
    try:
        ledger = Ledger(store)
        old = ledger.case("svc", "OLD")
        assert old.restarted_at == T0 and (old.restart_deadline, old.restart_finding) == (None, None)
        # a new finding inherits the old restart; with no finding recorded it is judged as before
        new = ledger.touch_case(finding("leak", "NEW", T0 + 9000), T0 + 30, WINDOW)
        assert new.restarted_at == T0 and not new.after_restart
        Ledger(store)  # opening it again changes nothing
        columns = [row[1] for row in store.query("PRAGMA table_info(remediation_cases)")]
        assert columns.count("restart_deadline") == 1 and columns.count("restart_finding") == 1
    finally:
        store.close()
