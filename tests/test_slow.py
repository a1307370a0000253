"""The slow detector on series with known shapes: SLO, peers, trend, causes, hysteresis, restarts."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config.loader import parse_config
from agent.detect.lifecycle import update
from agent.detect.model import InstanceSeries
from agent.detect.slow.detector import (
    DEFAULT_SLOW,
    Slo,
    SlowParams,
    evaluate_slow,
    fleets,
    slo_from_settings,
    tick_for,
)
from agent.detect.slow.relative import RatioAt, relative_instants, relative_rise, steadied
from agent.detect.slow.rules import BASELINE_POINTS

P99 = "latency_p99_seconds"
T0 = 1_700_000_010.0  # a multiple of the 30 s grid
PARAMS = SlowParams(step=1.0)  # default windows, a judgement every second
SLO = Slo(0.99, 0.25, 300.0)


def series(
    name: str, shape, *, every: float = 5.0, span: float = 1800.0, metric: str = P99, **more
) -> InstanceSeries:
    """`shape(seconds since start)` sampled every `every` seconds up to T0 + span."""
    points = [(T0 + t, shape(t)) for t in _times(every, span)]
    return InstanceSeries(name, {metric: points, **more})


def _times(every: float, span: float) -> list[float]:
    return [i * every for i in range(int(span / every) + 1)]


def judge(fleet, at: float = 1800.0, slos=None, params=PARAMS, **kw):
    slos = {s.instance: SLO for s in fleet} if slos is None else slos
    return {o.instance: o for o in evaluate_slow(fleet, T0 + at, params, slos=slos, **kw)}


def noisy(level: float, seed: int = 1, spread: float = 0.1):
    rng = random.Random(seed)
    return lambda t: level * rng.uniform(1 - spread, 1 + spread)


# ----------------------------------------------------------------------------------- slo rule
def test_over_the_slo_for_the_whole_window_fires_and_names_the_rule():
    obs = judge([series("a", noisy(0.3))])["a"]
    assert obs.state == "firing" and obs.kind == "slow" and obs.severity == "error"
    assert obs.evidence["fired"] == ["slo"]
    slo = obs.evidence["rules"]["slo"]
    assert slo["state"] == "firing" and slo["over_fraction"] >= 0.9 and slo["threshold_seconds"] == 0.25
    assert "p99 over the 250ms SLO for 100% of the last 5m" in obs.summary and "[slo]" in obs.summary


def test_a_short_spike_does_not_fire():
    obs = judge([series("a", lambda t: 0.5 if 1600 <= t < 1660 else 0.05)])["a"]
    assert obs.state == "clear"
    assert obs.evidence["rules"]["slo"]["over_fraction"] == pytest.approx(0.2, abs=0.02)


def test_sparse_storage_of_an_unchanged_value_still_counts():
    """The agent stores a flat value again only every 60 s: a value holds until the next sample."""
    obs = judge([series("a", lambda t: 0.4, every=60.0)])["a"]
    assert obs.state == "firing"
    assert obs.evidence["rules"]["slo"]["covered_seconds"] == 300


def test_too_little_data_is_unknown_not_clear():
    short = InstanceSeries("a", {P99: [(T0 + 1700 + i, 0.4) for i in range(0, 100, 5)]})
    obs = judge([short])["a"]
    assert obs.state == "unknown" and "covers" in obs.evidence["rules"]["slo"]["summary"]
    nothing = judge([InstanceSeries("b", {"rss_bytes": [(T0, 1.0)]})])["b"]
    assert nothing.state == "unknown" and "configure latency.prometheus or latency.canary" in nothing.summary


def test_canary_latency_is_judged_when_there_is_no_histogram():
    obs = judge([series("a", noisy(0.3), metric="canary_latency_seconds", every=10.0)])["a"]
    assert obs.state == "firing" and obs.evidence["metric"] == "canary_latency_seconds"
    assert "canary latency over the 250ms SLO" in obs.summary


def test_the_slo_names_the_quantile_series():
    fleet = [
        InstanceSeries(
            "a",
            {
                P99: [(T0 + t, 0.05) for t in _times(5, 1800)],
                "latency_p50_seconds": [(T0 + t, 0.3) for t in _times(5, 1800)],
            },
        )
    ]
    assert judge(fleet)["a"].state == "clear"
    median_slo = judge(fleet, slos={"a": Slo(0.5, 0.25, 300.0)})["a"]
    assert median_slo.state == "firing" and "p50 over the 250ms SLO" in median_slo.summary


def test_hysteresis_open_hold_then_resolve_without_flapping():
    """Over the SLO, then hovering just under it (holding), then well under: one finding, opened once,
    resolved once."""

    def shape(t):
        if t < 900:
            return 0.3
        if t < 1500:
            return 0.24 if int(t / 5) % 2 else 0.26  # around the threshold: above 0.9 × 250 ms
        return 0.05

    fleet = [series("a", shape, span=2400)]
    params = SlowParams(step=30.0)
    active, transitions, states = [], [], []
    for at in range(300, 2400, 30):
        observations = evaluate_slow(fleet, T0 + at, params, slos={"a": SLO})
        states.append(observations[0].state)
        active, changes = update(active, observations, params)
        transitions += changes
    assert [t.change for t in transitions] == ["opened", "resolved"]
    assert "holding" in states
    opened, resolved = transitions
    assert T0 + 300 <= opened.ts <= T0 + 400 and T0 + 1650 <= resolved.ts <= T0 + 2100
    assert opened.finding.kind == "slow" and opened.finding.evidence["fired"] == ["slo"]


# ----------------------------------------------------------------------------------- peer rule
def test_peer_outlier_among_five():
    fleet = [series(f"p{i}", noisy(0.04, seed=i)) for i in range(4)] + [series("slow", noisy(0.2, seed=9))]
    got = judge(fleet, slos={})
    assert got["slow"].state == "firing" and got["slow"].evidence["fired"] == ["peer"]
    peer = got["slow"].evidence["rules"]["peer"]
    assert peer["peers"] == 4 and peer["ratio"] > 4 and peer["robust_z"] >= 5
    assert got["slow"].severity == "warning"
    assert all(got[f"p{i}"].state == "clear" for i in range(4))


def test_peer_rule_needs_enough_peers_and_takes_remote_ones():
    fleet = [series("p0", noisy(0.04)), series("p1", noisy(0.04, seed=2)), series("slow", noisy(0.2))]
    alone = judge(fleet, slos={})["slow"]
    assert alone.evidence["rules"]["peer"]["state"] == "unknown"
    assert "needs 3" in alone.evidence["rules"]["peer"]["summary"]
    remote = judge(fleet, slos={}, remote_peers={"host-b/p7": 0.041})["slow"]
    assert remote.state == "firing" and "remote:host-b/p7" in remote.evidence["rules"]["peer"]["peer_levels"]


MEAN = "latency_mean_seconds"


def test_a_mean_latency_finds_the_slow_instance_among_its_peers():
    """A summary without quantiles or a pair of counters gives only a mean: the peer rule judges it."""
    fleet = [series(f"m{i}", noisy(0.02, seed=i), metric=MEAN) for i in range(4)]
    fleet.append(series("slow", noisy(0.09, seed=7), metric=MEAN))
    got = judge(fleet, slos={})
    assert got["slow"].state == "firing" and got["slow"].evidence["fired"] == ["peer"]
    assert got["slow"].evidence["metric"] == MEAN
    assert (
        "slow is slow: mean latency 8" in got["slow"].summary
        and "the median of 4 peers" in got["slow"].summary
    )
    assert all(got[f"m{i}"].state == "clear" for i in range(4))


def test_an_slo_on_a_quantile_is_not_judged_from_a_mean():
    obs = judge([series("a", noisy(0.5), metric=MEAN)])["a"]
    slo = obs.evidence["rules"]["slo"]
    assert slo["state"] == "unknown" and "gives only a mean" in slo["summary"]
    assert obs.state != "firing"


def test_peers_are_compared_on_the_same_figure():
    """Two instances read from histograms (p99) and three from counters (means, lower by nature):
    each is compared with the peers of its own figure, so no p99 looks slow beside the means."""
    fleet = [series(f"h{i}", noisy(0.1, seed=i)) for i in range(2)]
    fleet += [series(f"c{i}", noisy(0.02, seed=10 + i), metric=MEAN) for i in range(3)]
    got = judge(fleet, slos={})
    for name in ("h0", "h1"):
        peer = got[name].evidence["rules"]["peer"]
        assert peer["state"] == "unknown" and "1 peer(s) with p99 data" in peer["summary"]
    assert "2 peer(s) with mean latency data" in got["c0"].evidence["rules"]["peer"]["summary"]
    assert not any(o.state == "firing" for o in got.values())


@pytest.mark.parametrize(
    ("peers", "level", "state"),
    [
        ([0.040, 0.041, 0.039, 0.040], 0.044, "clear"),  # 10 % above: normal
        ([0.040, 0.040, 0.040, 0.040], 0.068, "holding"),  # 1.7×: above the clear ratio, below the firing one
        ([0.040, 0.040, 0.040, 0.040], 0.084, "firing"),  # 2.1×
        ([0.001, 0.001, 0.001, 0.001], 0.003, "clear"),  # 3× but 2 ms: under the absolute floor
        ([0.040, 0.200, 0.045, 0.300], 0.250, "clear"),  # the peers themselves disagree
    ],
)
def test_peer_thresholds(peers, level, state):
    fleet = [series(f"p{i}", lambda t, v=v: v) for i, v in enumerate(peers)] + [series("x", lambda t: level)]
    assert judge(fleet, slos={})["x"].evidence["rules"]["peer"]["state"] == state


# ----------------------------------------------------------------------------------- trend rule
def test_steady_degradation_fires_the_trend_rule():
    rng = random.Random(3)
    obs = judge([series("a", lambda t: (0.02 + 0.04 * t / 1800) * rng.uniform(0.9, 1.1))], slos={})["a"]
    assert obs.state == "firing" and obs.evidence["fired"] == ["trend"]
    trend = obs.evidence["rules"]["trend"]
    assert trend["confidence"] >= 0.999 and trend["growth_over_window"] > 1.0


def test_trend_far_from_the_slo_only_holds():
    rng = random.Random(3)
    far = Slo(0.99, 30.0, 300.0)
    obs = judge([series("a", lambda t: (0.02 + 0.04 * t / 1800) * rng.uniform(0.9, 1.1))], slos={"a": far})[
        "a"
    ]
    assert obs.evidence["rules"]["trend"]["state"] == "holding"
    assert obs.evidence["rules"]["trend"]["time_to_slo_seconds"] > 3600


@pytest.mark.parametrize(
    "shape",
    [
        lambda t: 0.02 if t < 900 else 0.04,  # a step (a model reload) that stays flat
        lambda t: 0.06 - 0.04 * math.exp(-t / 200),  # warm-up that levels off
        noisy(0.05),  # flat noise
    ],
)
def test_steps_plateaus_and_noise_are_not_degradation(shape):
    obs = judge([series("a", shape)], slos={})["a"]
    assert obs.evidence["rules"]["trend"]["state"] != "firing"


# ----------------------------------------------------------------------------------- causes, restarts
def test_throttling_and_memory_pressure_are_attached_as_likely_causes():
    times = _times(5, 1800)
    more = {
        "cgroup_cpu_periods_total": [(T0 + t, t * 10) for t in times],
        "cgroup_cpu_throttled_periods_total": [(T0 + t, t * 4) for t in times],
        "cgroup_memory_pressure_some_seconds_total": [(T0 + t, t * 0.2) for t in times],
        "rss_bytes": [(T0 + t, 950.0) for t in times],
        "memory_limit_bytes": [(T0 + t, 1000.0) for t in times],
    }
    obs = judge([series("a", noisy(0.3), **more)])["a"]
    causes = {c["cause"]: c for c in obs.evidence["likely_causes"]}
    assert causes["cpu_throttling"]["throttled_period_ratio"] == pytest.approx(0.4)
    assert causes["memory_pressure"]["stall_seconds_per_second"] == pytest.approx(0.2)
    assert causes["memory_near_limit"]["used_ratio"] == pytest.approx(0.95)
    assert "likely cause: CPU throttled by its cgroup quota in 40% of periods" in obs.summary
    healthy = judge([series("b", noisy(0.05), **more)])["b"]
    assert healthy.state == "clear" and "likely_causes" not in healthy.evidence


def test_only_the_current_process_lifetime_counts_and_a_restart_resolves():
    restart = T0 + 1500
    slow_then_fast = series("a", lambda t: 0.4 if t < 1500 else 0.03)
    slow_then_fast.restarts = [restart]
    before = evaluate_slow([slow_then_fast], T0 + 1490, PARAMS, slos={"a": SLO})[0]
    after = evaluate_slow([slow_then_fast], T0 + 1800, PARAMS, slos={"a": SLO})[0]
    assert before.state == "firing" and after.lifetime_start == restart
    assert after.evidence["rules"]["slo"]["state"] == "clear"
    active, _ = update([], [before], PARAMS)
    active, _ = update(
        active, [evaluate_slow([slow_then_fast], T0 + 1495, PARAMS, slos={"a": SLO})[0]], PARAMS
    )
    assert active[0].state == "open"
    active, changes = update(active, [after], PARAMS)
    assert active == [] and [(c.change, c.reason) for c in changes] == [("resolved", "the process restarted")]


# ----------------------------------------------------------------------------------- plumbing
def test_slo_from_a_real_config():
    config = parse_config(
        "instances: [{name: a, match: {pid: 3}, latency: {slo: {quantile: 0.999, threshold: 100ms, for: 2m}}},"
        " {name: b, match: {pid: 4}}]"
    )
    settings_a, settings_b = (spec.model_dump(mode="json") for spec in config.instances)
    assert slo_from_settings(settings_a) == Slo(0.999, 0.1, 120.0)
    assert slo_from_settings(settings_b) is None and slo_from_settings(None) is None


def test_judgements_fall_on_a_grid_and_fleets_group_by_label():
    assert tick_for(T0 + 44.9, DEFAULT_SLOW) == tick_for(T0 + 31, DEFAULT_SLOW) == T0 + 30
    a, b, c = (InstanceSeries(n, {}) for n in "abc")
    groups = fleets([a, b, c], {"a": {"fleet": "x"}, "b": {"fleet": "y"}, "c": {"fleet": "x"}})
    assert [[s.instance for s in g] for g in groups] == [["a", "c"], ["b"]]
    with pytest.raises(ValueError, match="trend_buckets"):
        SlowParams(trend_buckets=2)


_point_values = st.one_of(st.floats(min_value=0, max_value=100), st.sampled_from([math.nan, math.inf]))


@given(
    st.lists(st.lists(st.tuples(st.floats(0, 2000), _point_values), max_size=40), min_size=1, max_size=5),
    st.floats(0, 2500),
)
@settings(max_examples=150, deadline=None)
def test_fuzz_any_series_gives_one_valid_observation_each(raw, at):
    fleet = [InstanceSeries(f"i{n}", {P99: sorted((T0 + t, v) for t, v in pts)}) for n, pts in enumerate(raw)]
    observations = evaluate_slow(fleet, T0 + at, SlowParams(step=1.0), slos={"i0": SLO})
    assert [o.instance for o in observations] == [s.instance for s in fleet]
    assert all(o.state in ("firing", "holding", "clear", "unknown") for o in observations)


def test_inputs_are_catalog_metrics_and_history_covers_every_window():
    from agent.core.catalog import CATALOG
    from agent.detect.slow.detector import CAUSE_METRICS, INPUT_METRICS, causes_history, history

    assert set(INPUT_METRICS) - set(CATALOG) <= {"process_start_time_seconds"}
    assert history(PARAMS, {"a": Slo(window=3600.0), "b": None}) >= 3600.0 + PARAMS.stale
    assert history() >= DEFAULT_SLOW.trend_window
    # the relative rule's instants before its window, each a peer-window level
    assert history() >= DEFAULT_SLOW.relative_reach + DEFAULT_SLOW.peer_window
    # the likely causes are read over the SLO's `for` or the peer window: loaded over that, not hours
    assert set(CAUSE_METRICS) < set(INPUT_METRICS)
    assert causes_history(PARAMS, {"a": Slo(window=3600.0)}) >= 3600.0 + PARAMS.stale
    assert DEFAULT_SLOW.peer_window + DEFAULT_SLOW.stale <= causes_history() < history() / 10


def test_the_lifetime_is_the_recorded_process_start_not_the_first_sample_loaded():
    """The agent loads only the slow detector's history: a process up for longer than that must
    keep its own start time (remediation compares it with the instance's), and a later sample
    of the same start time must not look like a restart."""
    started = T0 - 86_400.0  # a day before the history window
    start_times = [(T0 + t, started) for t in _times(30, 1800)]
    long_lived = series("a", noisy(0.3), process_start_time_seconds=start_times)
    early = evaluate_slow([long_lived], T0 + 900, PARAMS, slos={"a": SLO})[0]
    late = evaluate_slow([long_lived], T0 + 1800, PARAMS, slos={"a": SLO})[0]
    assert early.lifetime_start == late.lifetime_start == started
    active, _ = update([], [early], PARAMS)
    active, changes = update(active, [late], PARAMS)
    assert not [c for c in changes if c.change == "resolved"] and active[0].state == "open"


def _ratios_at(peers: list[float], ratio_of) -> list[RatioAt]:
    """An instance's ratios at the relative rule's instants for a tick at T0, each peers' median
    in `peers` (oldest first) giving the ratio `ratio_of(median)`."""
    instants = relative_instants(T0, DEFAULT_SLOW)
    return [RatioAt(at, ratio_of(m), m) for at, m in zip(instants, peers, strict=True)]


def test_ratios_are_set_to_the_fleets_usual_level_only_when_they_move_with_it():
    """A fast pod sharing a queueing delay with its peers: its ratio (base + delay) / (median base
    + delay) falls as the delay ebbs, by an elasticity of 1/r - 1 at ratio r. Creeping 1.6x over
    the window while it ebbs, its ratio rises by a fifth; set to the fleet's usual level, by more.
    Its healthy twin's falling ratio is left as it is (nothing the rule would look at), and so
    are the ratios of a pod whose latency scales with the fleet's."""
    levels = [0.10 - 0.002 * k for k in range(24)]  # the fleet's median ebbing, oldest first
    creep = [1.0] * BASELINE_POINTS + [1 + 0.6 * k / 11 for k in range(12)]
    healthy = _ratios_at(levels, lambda m: (m - 0.02) / m)  # 20 ms faster than the median
    creeping = [p._replace(ratio=p.ratio * c) for p, c in zip(healthy, creep, strict=True)]
    assert steadied(healthy, T0, DEFAULT_SLOW) == (healthy, 0.0)
    steady, elasticity = steadied(creeping, T0, DEFAULT_SLOW)
    usual = statistics.geometric_mean(p.ratio for p in creeping[:BASELINE_POINTS])
    assert 0.1 < elasticity <= 1 / usual - 1 + 1e-12
    assert [p.at for p in steady] == [p.at for p in creeping]
    raw_rise = relative_rise(creeping[BASELINE_POINTS:])[2]
    assert 0.15 < raw_rise < 0.3  # short of the rule's 30 % ...
    assert relative_rise(steady[BASELINE_POINTS:])[2] > 0.3  # ... and past it once steadied
    scaled = _ratios_at(levels, lambda m: 0.7 * (1 + 0.01 * math.sin(m * 1e4)))
    scaled = [p._replace(ratio=p.ratio * c) for p, c in zip(scaled, creep, strict=True)]
    assert steadied(scaled, T0, DEFAULT_SLOW) == (scaled, 0.0)


@given(
    st.lists(st.floats(0.001, 10.0), min_size=24, max_size=24),
    st.lists(st.floats(0.05, 20.0), min_size=24, max_size=24),
)
@settings(max_examples=200, deadline=None)
def test_fuzz_an_elasticity_stays_within_what_a_delay_shared_in_full_gives(peers, ratios):
    """Whatever the ratios, the elasticity lies between 0 and 1/r - 1 at the geometric mean r of
    the ratios before the window, and a ratio is changed only by it."""
    given_ratios = iter(ratios)
    points = _ratios_at(peers, lambda _median: next(given_ratios))
    steady, elasticity = steadied(points, T0, DEFAULT_SLOW)
    shared = 1 / statistics.geometric_mean(p.ratio for p in points[:BASELINE_POINTS]) - 1
    assert min(0.0, shared) - 1e-9 <= elasticity <= max(0.0, shared) + 1e-9
    assert all(math.isfinite(p.ratio) and p.ratio > 0 for p in steady)
    if elasticity == 0:
        assert steady == points
