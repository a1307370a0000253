"""A job's outside source is said to fail once per failing streak, and to work once after it."""

from __future__ import annotations

from agent.jobs.streak import FailureStreak


def test_each_transition_is_said_once():
    streak = FailureStreak()
    assert not streak.working  # never tried
    assert streak.failed() and not streak.failed() and not streak.failed()  # a streak: said at its start
    assert not streak.working
    assert streak.succeeded() and streak.working  # the recovery is said
    assert not streak.succeeded()  # later successes are not
    assert streak.failed()  # a new streak is said again


def test_the_first_try_that_works_is_said():
    streak = FailureStreak()
    assert streak.succeeded() and not streak.succeeded()
