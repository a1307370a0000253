"""The finding lifecycle: pending → open → resolved, with hysteresis and no flapping."""

from __future__ import annotations

from dataclasses import replace

from agent.detect import DetectParams, Observation, update

P = DetectParams(open_after=2, resolve_after=3)


def obs(
    state: str, tick: float, *, severity: str = "warning", verdict: str | None = "leak", life: float = 0.0
):
    return Observation(
        "i", "leak", state, tick, life, f"{state} at {tick}", severity, verdict, {"tick": tick}
    )


def run(states: list[str], params: DetectParams = P):
    """Feed one observation per tick; return (active findings, all transitions)."""
    active, transitions = [], []
    for tick, state in enumerate(states, 1):
        active, new = update(active, [obs(state, float(tick))], params)
        transitions += new
    return active, transitions


def changes(transitions) -> list[tuple[str, float]]:
    return [(t.change, t.ts) for t in transitions]


def test_a_finding_opens_after_consecutive_firing_judgements():
    active, transitions = run(["firing"])
    assert [f.state for f in active] == ["pending"] and transitions == []
    active, transitions = run(["firing", "firing"])
    assert changes(transitions) == [("opened", 2.0)]
    finding = active[0]
    assert finding.state == "open" and finding.first_seen == 1.0 and finding.opened_at == 2.0
    assert finding.id == "i:leak:1"


def test_a_single_firing_judgement_followed_by_clear_leaves_nothing():
    active, transitions = run(["firing", "clear", "firing", "clear"])
    assert active == [] and transitions == []


def test_holding_neither_opens_nor_resolves():
    active, transitions = run(["firing", "holding", "firing"])
    assert changes(transitions) == [("opened", 3.0)]
    active, transitions = run(["firing", "firing", "clear", "clear", "holding", "clear", "clear"])
    assert changes(transitions) == [("opened", 2.0)]
    assert active[0].state == "open"


def test_an_open_finding_resolves_only_after_consecutive_clear_judgements():
    active, transitions = run(["firing", "firing", "clear", "clear", "firing", "clear", "clear", "clear"])
    assert changes(transitions) == [("opened", 2.0), ("resolved", 8.0)]
    assert active == []
    resolved = transitions[-1].finding
    assert resolved.state == "resolved" and resolved.resolved_at == 8.0 and resolved.opened_at == 2.0


def test_unknown_changes_nothing():
    active, transitions = run(["firing", "firing", "unknown", "unknown", "unknown", "unknown"])
    assert changes(transitions) == [("opened", 2.0)] and active[0].state == "open"


def test_a_severity_change_of_an_open_finding_is_an_update_event():
    active, _ = run(["firing", "firing"])
    active, transitions = update(active, [obs("firing", 3.0, severity="critical")], P)
    assert changes(transitions) == [("updated", 3.0)]
    assert active[0].severity == "critical" and "warning -> critical" in transitions[0].reason
    active, transitions = update(active, [obs("firing", 4.0, severity="critical")], P)
    assert transitions == []


def test_a_restart_resolves_the_findings_of_the_old_lifetime():
    active, _ = run(["firing", "firing"])
    active, transitions = update(active, [obs("unknown", 3.0, life=2.5)], P)
    assert changes(transitions) == [("resolved", 3.0)] and transitions[0].reason == "the process restarted"
    assert active == []


def test_the_same_tick_counts_once_however_often_the_agent_asks():
    active, _ = update([], [obs("firing", 1.0)], P)
    for _ in range(5):
        active, transitions = update(active, [obs("firing", 1.0)], P)
        assert transitions == [] and active[0].state == "pending"
    active, transitions = update(active, [obs("firing", 2.0)], P)
    assert changes(transitions) == [("opened", 2.0)]


def test_update_does_not_modify_its_inputs():
    active, _ = run(["firing", "firing"])
    before = replace(active[0], evidence=dict(active[0].evidence))
    update(active, [obs("clear", 3.0)], P)
    assert active[0] == before


def test_a_resolution_can_carry_a_new_verdict():
    states = ["firing", "firing", "clear", "clear"]
    active, transitions = [], []
    for tick, state in enumerate(states, 1):
        verdict = "working-set-plateau" if state == "clear" else "leak"
        active, new = update(
            active, [obs(state, float(tick), verdict=verdict)], DetectParams(resolve_after=2)
        )
        transitions += new
    assert transitions[-1].change == "resolved"
    assert transitions[-1].finding.verdict == "working-set-plateau"
    assert transitions[-1].to_dict()["finding"]["verdict"] == "working-set-plateau"


def test_suspects_and_attribution_stay_with_the_finding_across_judgements():
    """The detection job adds them; a later judgement's figures replace the detector's evidence only."""
    active, _ = run(["firing", "firing"])
    active[0].evidence |= {
        "suspects": [{"name": "com.app.Leak"}],
        "attribution": {"growth_layer": "jvm_heap"},
    }
    for tick in (3.0, 4.0, 5.0):
        active, _ = update(active, [obs("firing", tick)], P)
    evidence = active[0].evidence
    assert evidence["tick"] == 5.0
    assert evidence["suspects"] == [{"name": "com.app.Leak"}]
    assert evidence["attribution"] == {"growth_layer": "jvm_heap"}


def test_an_open_findings_verdict_changes_only_after_the_challenger_holds_twice():
    """oom-risk's verdict follows whichever explanation fires at each judgement; once shown it
    changes only when another has been judged `open_after` times in a row, as one event, and a
    judgement without a verdict keeps the one there is."""
    from agent.detect import DetectParams
    from agent.detect.lifecycle import update
    from agent.detect.model import Observation

    params = DetectParams()

    def obs(tick: float, verdict):
        return Observation("a", "oom-risk", "firing", tick, 0.0, f"{verdict}", "error", verdict, {})

    active, changes = [], []
    sequence = ["allocator-retention", "allocator-retention", "leak", None, "leak", "allocator-retention",
                "leak", "leak", "leak"]  # fmt: skip
    seen = []
    for i, verdict in enumerate(sequence):
        active, transitions = update(active, [obs(3600.0 * (i + 1), verdict)], params)
        changes += transitions
        seen.append(active[0].verdict)
    assert seen == ["allocator-retention"] * 7 + ["leak", "leak"]
    updates = [t for t in changes if t.change == "updated"]
    assert len(updates) == 1 and "verdict allocator-retention -> leak" in updates[0].reason


def test_a_holding_finding_resolves_once_the_oom_it_projected_was_due_and_did_not_come():
    """Holding keeps a finding open only while its projection stands: the OOM its last firing
    judgement projected was due, the process lives on, and `resolve_after` judgements have passed
    since with none firing. Twins: a firing judgement in between renews the projection; a finding
    that projects no OOM holds."""
    step = P.step
    due = 6 * step  # the projected OOM; then `resolve_after` (3) judgements

    def feed(states: list[str], ttoom: float | None) -> tuple[list, list]:
        active, transitions = [], []
        for i, state in enumerate(states):
            judged = replace(obs(state, i * step), evidence={"time_to_oom_seconds": ttoom})
            active, new = update(active, [judged], P)
            transitions += new
        return active, transitions

    active, transitions = feed(["firing", "firing"] + ["holding"] * 9, due)
    assert changes(transitions) == [("opened", step), ("resolved", 10 * step)]
    assert transitions[-1].reason.startswith(
        "the OOM projected 6h after the last firing judgement did not come"
    )
    assert active == []

    # one judgement short: still open
    active, transitions = feed(["firing", "firing"] + ["holding"] * 8, due)
    assert [f.state for f in active] == ["open"]
    # a firing judgement in between renews the projection
    active, transitions = feed(["firing", "firing"] + ["holding"] * 4 + ["firing"] + ["holding"] * 8, due)
    assert [f.state for f in active] == ["open"] and changes(transitions) == [("opened", step)]
    # an OOM due within the step still waits for `resolve_after` judgements after it
    active, transitions = feed(["firing", "firing"] + ["holding"] * P.resolve_after, step / 4)
    assert [f.state for f in active] == ["open"]
    active, transitions = feed(["firing", "firing"] + ["holding"] * (P.resolve_after + 1), step / 4)
    assert active == [] and transitions[-1].change == "resolved"
    # no projection (slow growth), or one already past (peaks above the limit): holding holds
    for ttoom in (None, 0.0, -step):
        active, transitions = feed(["firing", "firing"] + ["holding"] * 30, ttoom)
        assert [f.state for f in active] == ["open"], ttoom
    # a pending finding whose projection lapsed is dropped without an event
    active, transitions = feed(["firing"] + ["holding"] * 9, due)
    assert active == [] and transitions == []
