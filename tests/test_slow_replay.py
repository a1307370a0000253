"""The slow replay's screen judges in full only the ticks where a rule might fire, and finds
exactly what judging every tick finds: the findings, their times and their figures."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent.detect.lifecycle import update
from agent.detect.model import START_TIME, InstanceAnalysis, InstanceSeries
from agent.detect.slow import relative
from agent.detect.slow.detector import DEFAULT_SLOW, evaluate_slow, history
from agent.detect.slow.replay import _FleetReplay, _Window, analyze_slow, grid
from agent.detect.slow.rules import Slo
from agent.detect.trend import _kernels

T0 = 1_767_571_200.0
P99 = "latency_p99_seconds"
MEAN = "latency_mean_seconds"

pytestmark = pytest.mark.skipif(_kernels is None, reason="the C screen is not built")


def reference(members, params, slos):
    """The plain replay: every tick, the whole fleet through `evaluate_slow` and `update`."""
    span = history(params, slos)
    windows = [_Window(s) for s in members]
    first = min(min(p[0][0] for p in w.metrics.values()) for w in windows)
    last = max(max(p[-1][0] for p in w.metrics.values()) for w in windows)
    active, opened, at_open = [], {}, {}
    for tick in grid(first, last, params):
        observations = evaluate_slow([w.at(tick - span, tick) for w in windows], tick, params, slos=slos)
        active, transitions = update(active, observations, params)
        for change in transitions:
            opened[change.finding.id] = change.finding
            if change.change == "opened":
                at_open[change.finding.id] = change.finding
    for finding in active:
        if finding.state == "open":
            opened[finding.id] = finding
    return {f.id: (f, at_open.get(f.id)) for f in opened.values()}


def fleet(draw_seed: int, shapes: list[dict], every: float, hours: float, decimals: int | None) -> list:
    rng = random.Random(draw_seed)
    members = []
    for n, shape in enumerate(shapes):
        points, means, starts = [], [], []
        start = T0
        ts = T0 + rng.uniform(0, every)
        while ts < T0 + hours * 3600:
            in_gap = shape["gap"][0] <= ts - T0 < shape["gap"][0] + shape["gap"][1]
            source = shape.get("source", "p99")
            if source == "both" and in_gap:  # a histogram's quantiles gone, its mean kept
                means.append((ts, shape["base"] * 0.5))
            elif not in_gap:
                value = shape["base"] * math.exp(rng.gauss(0, shape["noise"]))
                at = ts - T0 - shape["event"]
                if shape["kind"] == "slow" and 0 <= at < shape["length"]:
                    value *= shape["size"]
                elif shape["kind"] == "ramp" and at >= 0:
                    value *= 1 + shape["size"] * min(at, shape["length"]) / 3600
                elif shape["kind"] == "step" and at >= 0:
                    value *= shape["size"]
                if decimals is not None:
                    value = round(value, decimals)
                if source != "mean":
                    points.append((ts, value))
                if source != "p99":
                    means.append((ts, value * 0.5))
            if shape["restart"] and ts - T0 >= shape["event"] and start == T0:
                start = ts
            if shape["starts"]:
                starts.append((ts, start))
            ts += every * rng.choice((1, 1, 1, 2)) if shape["jitter"] else every
        series = {P99: points, MEAN: means}
        if starts:
            series[START_TIME] = starts
        members.append(InstanceSeries(f"i{n}", series))
    return members


shape = st.fixed_dictionaries(
    {
        "base": st.floats(0.0, 0.3),
        "noise": st.sampled_from([0.0, 0.02, 0.1, 0.4]),
        "kind": st.sampled_from(["none", "slow", "ramp", "step"]),
        "event": st.floats(0, 3 * 3600),
        "length": st.floats(60, 7200),
        "size": st.floats(0.3, 12),
        "gap": st.tuples(st.floats(0, 4 * 3600), st.floats(0, 7200)),  # past the history: skipped ticks
        "restart": st.booleans(),
        "starts": st.booleans(),
        "jitter": st.booleans(),
        # a histogram (p99, and its mean beside it), a summary or counters (a mean only)
        "source": st.sampled_from(["p99", "p99", "both", "mean"]),
    }
)


def judged(members: list) -> list:
    return [m for m in members if m.series[P99] or m.series[MEAN]]


def _shape(base, source, gap, *, starts=True, restart=False, jitter=False, event=0.0):
    return dict(base=base, source=source, gap=gap, starts=starts, restart=restart, jitter=jitter, event=event,
                noise=0.0, kind="none", size=1.0, length=1800.0)  # fmt: skip


# a fleet where one instance's p99 comes back after 1 h 50 min of its mean alone: the judgements
# after that read its past from its p99 (none), not from the mean that earlier ticks judged it on
QUANTILE_BACK = [
    _shape(0.0947, "p99", (10883.8, 6867.3)),
    _shape(0.1651, "both", (0.0, 6615.8), restart=True, jitter=True, event=8563.5),
    _shape(0.2320, "mean", (7130.1, 5502.0), starts=False),
    _shape(0.0092, "mean", (0.4, 773.0), restart=True, jitter=True, event=3146.4),
    _shape(0.0267, "mean", (12065.4, 6802.7)),
    _shape(1e-12, "p99", (9237.0, 1811.8), starts=False, jitter=True, event=1.5),
]


# each example replays up to six members tick by tick twice (the reference judges every tick in
# Python): 20 random fleets and the two known ones take 1-2.5 min alone on 2 cores, twice that
# beside the rest of the suite, so the timeout is the hang guard of a long test, not of a unit test
@pytest.mark.timeout(900)
@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    shapes=st.lists(shape, min_size=1, max_size=6),
    every=st.sampled_from([15.0, 30.0, 60.0, 100.0]),
    decimals=st.sampled_from([None, 3, 2]),
    slo=st.sampled_from([None, Slo(0.99, 0.25, 300.0), Slo(0.99, 0.05, 120.0)]),
    scale=st.sampled_from([1.0, 1.0, 7.0]),
)
@example(6414, QUANTILE_BACK, 15.0, None, Slo(0.99, 0.05, 120.0), 1.0)
@example(6414, QUANTILE_BACK, 15.0, 2, Slo(0.99, 0.05, 120.0), 1.0)
def test_the_screened_replay_finds_what_judging_every_tick_finds(seed, shapes, every, decimals, slo, scale):
    params = DEFAULT_SLOW if scale == 1.0 else DEFAULT_SLOW.scaled(scale)
    # scaled, long enough that the relative rule reads its instants before the window too
    members = judged(fleet(seed, shapes, every / scale, (4.5 if scale == 1.0 else 7.0) / scale, decimals))
    if not members:
        return
    slos = {m.instance: slo for m in members}
    expected = reference(members, params, slos)
    analyses = {m.instance: InstanceAnalysis(m.instance, [], [], [], None, None) for m in members}
    analyze_slow([members], analyses, params, slos=slos)
    got = {f.id: (f, a.at_open.get(f.id)) for a in analyses.values() for f in a.findings}
    assert got.keys() == expected.keys()
    for key, (finding, at_open) in got.items():
        assert finding == expected[key][0]
        assert at_open == expected[key][1]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    shapes=st.lists(shape, min_size=1, max_size=4),
    every=st.sampled_from([15.0, 60.0]),
    slo=st.sampled_from([None, Slo(0.99, 0.1, 300.0)]),
)
def test_the_screen_gives_each_tick_the_python_level_and_marks_every_firing_rule(seed, shapes, every, slo):
    members = judged(fleet(seed, shapes, every, 3.0, None))
    if not members:
        return
    params, slos = DEFAULT_SLOW, {m.instance: slo for m in members}
    replay = _FleetReplay(members, params, slos, screen=True)
    span = history(params, slos)
    for t, tick in enumerate(replay.ticks):
        observations = evaluate_slow(
            [w.at(tick - span, tick) for w in replay.windows], tick, params, slos=slos
        )
        for i, obs in enumerate(observations):
            rules = obs.evidence["rules"]
            python_level = rules["peer"].get("level_seconds") if rules["peer"]["state"] != "unknown" else None
            if python_level is not None:
                assert replay.level(i, t) == python_level
            if (
                "slo" in obs.evidence["fired"]
                or "trend" in obs.evidence["fired"]
                or "peer" in obs.evidence["fired"]
            ):
                assert t in replay.candidates[i]


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    shapes=st.lists(shape, min_size=3, max_size=6),
    every=st.sampled_from([15.0, 60.0]),
    scale=st.sampled_from([1.0, 7.0]),
)
def test_the_relative_rules_screen_marks_the_same_ticks_in_c_and_in_python(seed, shapes, every, scale):
    """`_kernels.rising_screen` and its twin `relative.rising_flags` give the replay the same
    candidate ticks (a build without the extension screens with the twin)."""
    params = DEFAULT_SLOW if scale == 1.0 else DEFAULT_SLOW.scaled(scale)
    members = judged(fleet(seed, shapes, every / scale, (4.5 if scale == 1.0 else 7.0) / scale, None))
    if not members:
        return
    with_c = _FleetReplay(members, params, {}, screen=True).candidates
    with pytest.MonkeyPatch.context() as m:
        m.setattr(relative, "_kernels", None)
        assert _FleetReplay(members, params, {}, screen=True).candidates == with_c


def test_a_replay_without_the_screen_is_the_same(tmp_path):
    members = fleet(3, [dict(base=0.05, noise=0.05, kind="slow", event=3600, length=1800, size=6, gap=(0, 0),
                             restart=False, starts=False, jitter=False)]
                    + [dict(base=0.05, noise=0.05, kind="none", event=0, length=60, size=1, gap=(0, 0),
                            restart=False, starts=False, jitter=False)] * 4, 60.0, 3.0, None)  # fmt: skip
    out = []
    for screen in (True, False):
        analyses = {m.instance: InstanceAnalysis(m.instance, [], [], [], None, None) for m in members}
        analyze_slow([members], analyses, DEFAULT_SLOW, screen=screen)
        out.append(
            {name: [(f.id, f.opened_at, f.resolved_at) for f in a.findings] for name, a in analyses.items()}
        )
    assert out[0] == out[1] and out[0]["i0"] and not out[0]["i1"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("slo", [None, Slo(0.99, 0.1, 300.0)])
def test_a_gap_in_every_member_skips_its_ticks_and_changes_no_finding(seed, slo):
    """The whole fleet goes quiet for two hours in the middle of a slow episode (the agent was
    away): the replay skips the ticks that see no sample, and finds what judging them all finds."""
    quiet = (2 * 3600.0, 2 * 3600.0)
    slow = dict(base=0.05, noise=0.05, kind="slow", event=1.5 * 3600, length=3 * 3600, size=6, gap=quiet,
                restart=False, starts=False, jitter=False)  # fmt: skip
    calm = {**slow, "kind": "none"}
    members = fleet(seed, [slow, calm, calm, calm], 60.0, 6.0, None)
    slos = {m.instance: slo for m in members}
    expected = reference(members, DEFAULT_SLOW, slos)
    analyses = {m.instance: InstanceAnalysis(m.instance, [], [], [], None, None) for m in members}
    ticks = analyze_slow([members], analyses, DEFAULT_SLOW, slos=slos)
    got = {f.id: (f, a.at_open.get(f.id)) for a in analyses.values() for f in a.findings}
    assert expected and got == expected
    assert (
        ticks < len(grid(T0, T0 + 6 * 3600, DEFAULT_SLOW)) - 3600 / DEFAULT_SLOW.step
    )  # an hour of ticks skipped


def test_a_fleet_wide_swing_is_no_slow_instance_and_a_creeping_one_is_found():
    """Eight pods whose p99 rises 2.5x over the morning together (traffic), one of them creeping
    +40 %/h on top from the third hour: the trend rule holds for the ones that rise with their
    peers, and the relative rule finds the creeping one within two hours."""

    rng = random.Random(5)
    onset = T0 + 3 * 3600
    members = []
    for i in range(8):
        base = rng.uniform(0.03, 0.06)
        points = []
        for k in range(int(8 * 3600 / 30)):
            ts = T0 + 30.0 * k
            swing = 1 + 1.5 * (0.5 - 0.5 * math.cos(math.pi * min(ts - T0, 6 * 3600) / (6 * 3600)))
            value = base * swing * math.exp(rng.gauss(0, 0.05))
            if i == 0 and ts >= onset:
                value *= 1 + 0.4 * (ts - onset) / 3600
            points.append((ts, value))
        members.append(InstanceSeries(f"p{i}", {P99: points}))
    analyses = {m.instance: InstanceAnalysis(m.instance, [], [], [], None, None) for m in members}
    analyze_slow(
        [members], analyses, DEFAULT_SLOW, slos={m.instance: Slo(0.99, 0.25, 300.0) for m in members}
    )
    found = {
        name: [f.opened_at for f in a.findings if f.opened_at is not None] for name, a in analyses.items()
    }
    assert not any(found[f"p{i}"] for i in range(1, 8)), found
    assert found["p0"] and onset <= min(found["p0"]) <= onset + 2 * 3600
    first = next(f for f in analyses["p0"].findings if f.opened_at == min(found["p0"]))
    assert "relative" in analyses["p0"].at_open[first.id].evidence["fired"]


def replayed(members: list, slos: dict, *, against_reference: bool = True) -> tuple[dict, dict]:
    """(analyses, each instance's opening times, sorted) of the screened replay of one fleet, held
    equal to judging every tick (`reference`) unless told not to (a long fleet)."""
    analyses = {m.instance: InstanceAnalysis(m.instance, [], [], [], None, None) for m in members}
    analyze_slow([members], analyses, DEFAULT_SLOW, slos=slos)
    if against_reference:
        got = {f.id: (f, a.at_open.get(f.id)) for a in analyses.values() for f in a.findings}
        assert got == reference(members, DEFAULT_SLOW, slos)
    found = {name: sorted(f.opened_at for f in a.findings if f.opened_at) for name, a in analyses.items()}
    return analyses, found


def queueing_fleet(seed: int, creep: float, hours: float = 9.0, ebbing: bool = False) -> tuple[list, float]:
    """Eight pods at 0.5-1.4x their median base latency sharing a queueing delay that rises 2.5x
    over the day (a fast pod's ratio to its peers rises with it: 0.5x towards 0.8x), or `ebbing`
    from its peak to nothing, pod 0 the fastest, creeping `creep` of its level per hour from the
    sixth hour."""
    rng = random.Random(seed)
    onset = T0 + 6 * 3600
    bases = [0.5, *(rng.uniform(0.7, 1.4) for _ in range(7))]
    members = []
    for i, base in enumerate(bases):
        points = []
        for k in range(int(hours * 3600 / 30)):
            ts = T0 + 30.0 * k
            load = 0.5 - 0.5 * math.cos(math.pi * (ts - T0) / (9 * 3600))
            if ebbing:
                load = 1 - load
            value = 0.04 * (base + 1.5 * load) * math.exp(rng.gauss(0, 0.05))
            if i == 0 and ts >= onset:
                value *= 1 + creep * (ts - onset) / 3600
            points.append((ts, value))
        members.append(InstanceSeries(f"p{i}", {P99: points}))
    return members, onset


def relative_at_open(seed: int, creep: float, within: float, ebbing: bool = False) -> dict:
    """The relative rule's figures at the finding that opened on pod 0 of `queueing_fleet` within
    `within` seconds of its onset; its healthy twin and every other pod get no finding."""
    slos = {f"p{i}": None for i in range(8)}
    for rate in (0.0, creep):
        members, onset = queueing_fleet(seed, rate, ebbing=ebbing)
        analyses, found = replayed(members, slos)
        assert not any(found[f"p{i}"] for i in range(1, 8)), found
        if not rate:
            assert not found["p0"], found
    assert found["p0"] and onset < found["p0"][0] <= onset + within, found
    first = next(f for f in analyses["p0"].findings if f.opened_at == found["p0"][0])
    return analyses["p0"].at_open[first.id].evidence["rules"]["relative"]


@pytest.mark.parametrize("seed", [1, 2])
def test_a_fast_pod_creeping_towards_its_peers_is_found_and_one_rising_with_the_queue_is_not(seed):
    """The relative rule measures a pod that usually runs faster than its peers against its own
    usual ratio: creeping +30 %/h it is found within two hours although still below 1.3x its peers;
    its healthy twin, whose ratio rises with the shared queueing delay alone, is not. The replay
    finds exactly what judging every tick finds, with those instants read."""
    relative = relative_at_open(seed, 0.3, 2 * 3600)
    assert relative["state"] == "firing"
    assert relative["usual_ratio"] < 0.8 and relative["ratio_to_peers"] < 1.3
    assert "usually" in relative["summary"]


@pytest.mark.parametrize("seed", [1, 2])
def test_a_fast_pod_creeping_while_the_shared_queue_ebbs_is_found_within_ninety_minutes(seed):
    """As the shared queueing delay ebbs, a fast pod's ratio to its peers falls (0.8x towards
    0.5x), so a creep of +40 %/h raises it by a quarter at most within the relative window: the
    relative rule sets each ratio to the fleet's usual level by how the pod's ratio moved with that
    level before the window, and finds it; its healthy twin, whose ratio falls with the queue, is
    not found."""
    relative = relative_at_open(seed, 0.4, 90 * 60, ebbing=True)
    assert relative["state"] == "firing" and relative["elasticity"] > 0.1
    assert "elasticity" in relative["summary"]


def slower_pod_fleet(seed: int, burst: float, minutes: float) -> tuple[list, float]:
    """Eight pods under a flat load, pod 0 usually 1.6x its peers (a busier node); from the fifth
    hour its latency is `burst` times that for `minutes`."""
    rng = random.Random(seed)
    start = T0 + 5 * 3600
    members = []
    for i in range(8):
        base = 0.064 if i == 0 else 0.04 * rng.uniform(0.9, 1.1)
        points = []
        for k in range(int(7 * 3600 / 30)):
            ts = T0 + 30.0 * k
            value = base * math.exp(rng.gauss(0, 0.05))
            if i == 0 and start <= ts < start + 60 * minutes:
                value *= burst
            points.append((ts, value))
        members.append(InstanceSeries(f"p{i}", {P99: points}))
    return members, start


@pytest.mark.parametrize("seed", [1, 2])
def test_the_peer_rule_holds_a_pod_to_where_it_usually_sits_among_its_peers(seed):
    """A pod usually 1.6x its peers whose level touches 2.1x for a few minutes (noise) has not
    changed: no finding, where the 2x bar alone opens one. Tripled for 15 minutes, 4.8x its peers
    and 3x its usual ratio, it is found by the peer rule at once, which names where it usually
    sits; the replay finds what judging every tick finds."""
    slos = {f"p{i}": None for i in range(8)}
    for burst, minutes in ((1.3, 6), (3.0, 15)):
        members, start = slower_pod_fleet(seed, burst, minutes)
        analyses, found = replayed(members, slos)
        assert not any(found[f"p{i}"] for i in range(1, 8)), found
        if burst < 2:
            assert not found["p0"], found
            continue
        assert found["p0"] and start < found["p0"][0] <= start + 300, found
        first = next(f for f in analyses["p0"].findings if f.opened_at == found["p0"][0])
        peer = analyses["p0"].at_open[first.id].evidence["rules"]["peer"]
        assert peer["state"] == "firing" and 1.4 < peer["usual_ratio"] < 1.8
        assert f"usually {peer['usual_ratio']:.2f}×" in peer["summary"]


def test_a_pod_creeping_for_hours_is_still_found_at_twice_its_peers():
    """A pod creeping +10 %/h of its level (too slow for the relative rule's 30 % within its
    window) has a usual ratio to its peers that creeps behind it; once its ratio has held twice its
    peers' for a quarter of an hour the peer rule finds it, as it found it before it read the usual
    ratio at all."""
    rng = random.Random(3)
    onset = T0 + 2 * 3600
    members = []
    for i in range(8):
        base = 0.04 * rng.uniform(0.9, 1.1)
        points = []
        for k in range(int(13 * 3600 / 30)):
            ts = T0 + 30.0 * k
            value = base * math.exp(rng.gauss(0, 0.05))
            if i == 0 and ts >= onset:
                value *= 1 + 0.1 * (ts - onset) / 3600
            points.append((ts, value))
        members.append(InstanceSeries(f"p{i}", {P99: points}))
    analyses, found = replayed(members, {m.instance: None for m in members}, against_reference=False)
    assert not any(found[f"p{i}"] for i in range(1, 8)), found
    assert found["p0"] and onset + 9 * 3600 < found["p0"][0] < onset + 11 * 3600, found
    first = next(f for f in analyses["p0"].findings if f.opened_at == found["p0"][0])
    peer = analyses["p0"].at_open[first.id].evidence["rules"]["peer"]
    assert peer["state"] == "firing" and peer["usual_ratio"] > 1.3 and peer["ratio_lately"] >= 2
