"""Evidence from a workload's other instances, and the replay of a whole fleet.

Two patterns are stronger evidence than any one series:

- **fleet-wide leak**: the same growth in most instances of a workload, in the lifetimes they
  began together (a rollout) at most `FRESH` days ago. Once one of them fires, the others that grow alike fire with it,
  each with its own deadline, so the planner sees them all at once. Likewise once the safety net
  fires in most of a rollout, an instance projected to its limit alike (time to OOM and growth
  rate) fires its oom-risk with them; and when most of a rollout fires on its own at one
  judgement, the firings confirm each other: their findings open at once.
- **one instance growing while its peers stay flat**: the peers share its traffic, so its growth
  is not the daily cycle, a launch or a warm-up of the workload; it needs no daily profile.

`fleet_evidence` applies both to one tick's observations (the agent's detection job does it on
each judgement); `analyze_fleet` is `analyze` for the instances of one or more workloads, with
the workload's priors (given, and learned from the instances' history before each rollout).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from agent.core.units import format_bytes, format_duration
from agent.detect.coverage import Sight, seen_from, union
from agent.detect.lifecycle import update
from agent.detect.memory.engine import judge, judged_reach, replay_steps
from agent.detect.memory.leak import severity_for
from agent.detect.memory.prepared import Prepared
from agent.detect.memory.priors import learn_workload, merge
from agent.detect.model import Finding, InstanceAnalysis, InstanceSeries, Observation
from agent.detect.params import DetectParams
from agent.detect.seasonal import WorkloadProfile

FLEET_SHARE = 0.5  # a fleet-wide leak: growth in at least half of the instances...
FLEET_MIN = 3  # ...and in at least three
ALIKE = (0.67, 1.5)  # growth alike: a rate within these factors of the firing instances' median
PEERS_MIN = 3  # an instance growing alone needs at least three flat peers
FRESH = 3  # a fleet-wide leak is growth in lifetimes at most this many periods old
MAX_LEARNED = 256  # priors learned per (workload, start) kept by the agent
ROLLOUT = 6 * 3600.0  # lifetimes that began this close together began in one rollout (scaled with `window`)


DEFAULT_WINDOW = DetectParams().window


def _rollout(params: DetectParams) -> float:
    """How close together two lifetimes began to count as one rollout, on `params`' time scale."""
    return ROLLOUT * params.window / DEFAULT_WINDOW


def _fresh(obs: Observation, params: DetectParams) -> bool:
    """Whether `obs` is of a lifetime young enough for a fleet-wide leak (`FRESH` periods)."""
    return obs.tick - obs.lifetime_start <= FRESH * params.season


def _growing(obs: Observation, params: DetectParams) -> bool:
    e = obs.evidence
    return (
        obs.kind == "leak"
        and obs.state in ("firing", "holding")
        and obs.verdict != "working-set-plateau"
        and (e.get("confidence") or 0.0) >= params.confidence_clear
        and (e.get("pct_per_hour") or 0.0) >= params.min_rate
    )


def _flat(obs: Observation, params: DetectParams) -> bool:
    return (
        obs.kind == "leak"
        and obs.state == "clear"
        and (obs.evidence.get("confidence") or 0.0) < params.confidence_clear
    )


def _starters(observations: list[Observation], params: DetectParams) -> list[Observation]:
    """The leak observations of the instances that fire on their own evidence in a lifetime at most
    `FRESH` periods old: their leak fires, or their oom-risk does (the safety net) while their
    leak is seen growing (its rate is what the others are compared with)."""
    leaks = {o.instance: o for o in observations if o.kind == "leak"}
    oom = {o.instance for o in observations if o.kind == "oom-risk" and o.state == "firing"}
    return [
        o
        for o in leaks.values()
        if _fresh(o, params) and (o.state == "firing" or (o.instance in oom and _growing(o, params)))
    ]


def fleet_evidence(observations: list[Observation], params: DetectParams) -> list[Observation]:
    """One fleet's observations at one tick, with the fleet's evidence applied: holding leak
    observations promoted to firing when the fleet's pattern says so (see the module doc), and
    firing ones confirmed (they open at once) when at least half (and three) of the instances of
    their rollout fire on their own at this judgement."""
    leaks = {o.instance: o for o in observations if o.kind == "leak"}
    if len(leaks) < 2:
        return observations
    rollout = _rollout(params)
    out: list[Observation] = []
    firing = _starters(observations, params)
    for obs in observations:
        if obs.kind != "leak" or obs.state != "holding" or not _growing(obs, params):
            out.append(obs)
            continue
        together = [o for o in leaks.values() if abs(o.lifetime_start - obs.lifetime_start) <= rollout]
        starters = [o for o in firing if o in together]
        rates = sorted(o.evidence.get("pct_per_hour") or 0.0 for o in starters)
        typical = rates[len(rates) // 2] if rates else 0.0
        alike = [
            o for o in together
            if _growing(o, params) and ALIKE[0] * typical <= (o.evidence.get("pct_per_hour") or 0.0) <= ALIKE[1] * typical
        ]  # fmt: skip
        if obs not in alike or not (
            obs.evidence.get("seasonal_adjusted") or obs.evidence.get("scale") == "daily"
        ):
            alike = []  # without a daily profile the whole fleet rises with the traffic together
        needed = max(FLEET_MIN, math.ceil(FLEET_SHARE * len(together)))
        peers = [o for o in leaks.values() if o is not obs]
        flat = [o for o in peers if _flat(o, params)]
        if starters and len(alike) >= needed:
            out.append(_promoted(obs, params, "fleet-wide", sorted(o.instance for o in alike), len(together)))
        elif (
            len(flat) >= PEERS_MIN
            and len(flat) == len(peers)
            and (obs.evidence.get("confidence") or 0) >= params.confidence
        ):
            out.append(_promoted(obs, params, "alone", [obs.instance], len(leaks)))
        else:
            out.append(obs)
    own = {o.instance: o.lifetime_start for o in firing} | {
        o.instance: o.lifetime_start
        for o in observations
        if o.kind == "oom-risk" and o.state == "firing" and _fresh(o, params)
    }
    return _confirmed(_bound_together(out, params), own, params)


def _bound_together(observations: list[Observation], params: DetectParams) -> list[Observation]:
    """Holding oom-risk observations promoted when at least half (and three) of the instances of
    their rollout are projected to their limits by the safety net at this judgement and this one
    is projected alike: a time to OOM and a growth rate each within `ALIKE` of those instances'
    medians, by a fit that has seen growth for at least as long as the time it projects (the
    safety net's own bar before the daily profile is known). The rollout's trajectory stands in
    for the steadiness this instance's fit lacks (the tail of its warm-up ahead of its leak),
    never for projecting further than its growth was seen: a healthy instance near its limit that
    only rises with the traffic (its window rising, its wider scales flat) stays as it is."""
    rollout = _rollout(params)
    ooms = [
        o
        for o in observations
        if o.kind == "oom-risk" and _fresh(o, params) and o.evidence.get("time_to_oom_seconds") is not None
    ]
    loud = [o for o in ooms if o.state == "firing"]
    if len(loud) < FLEET_MIN:
        return observations
    out = []
    for obs in observations:
        if obs not in ooms or obs.state != "holding":
            out.append(obs)
            continue
        together = [o for o in ooms if abs(o.lifetime_start - obs.lifetime_start) <= rollout]
        bound = [o for o in loud if o in together]
        seen = obs.evidence.get("span_seconds") or 0.0
        if (
            len(bound) < max(FLEET_MIN, math.ceil(FLEET_SHARE * len(together)))
            or seen < obs.evidence["time_to_oom_seconds"]
            or not all(
                _alike(obs.evidence.get(key) or 0.0, [o.evidence.get(key) or 0.0 for o in bound])
                for key in ("time_to_oom_seconds", "pct_per_hour")
            )
        ):
            out.append(obs)
            continue
        fleet = {
            "pattern": "fleet-wide",
            "growing": sorted(o.instance for o in bound)[:50],
            "instances": len(together),
        }
        why = f"{len(bound)} of the {len(together)} instances of its rollout are projected to their limits alike"
        out.append(
            replace(
                obs,
                state="firing",
                severity="error",  # critical needs its own fit to rule saturation out (`oom.saturation_ruled_out`)
                summary=f"{obs.summary}; {why}",
                evidence=obs.evidence | {"fleet": fleet},
            )
        )
    return out


def _alike(value: float, others: list[float]) -> bool:
    ordered = sorted(others)
    typical = ordered[len(ordered) // 2]
    return typical > 0 and ALIKE[0] * typical <= value <= ALIKE[1] * typical


def _confirmed(
    observations: list[Observation], starts: dict[str, float], params: DetectParams
) -> list[Observation]:
    """Firing leak and oom-risk observations confirmed by their rollout: at least half (and three)
    of the instances that began within `ROLLOUT` of them fire on their own at this judgement.
    One series firing twice an hour apart is the lifecycle's confirmation; that many series
    firing at once is a stronger one, so their findings open at once."""
    if len(starts) < FLEET_MIN:
        return observations
    rollout = _rollout(params)
    lifetimes = {o.instance: o.lifetime_start for o in observations if o.kind == "leak"}
    out = []
    for obs in observations:
        if obs.kind in ("leak", "oom-risk") and obs.state == "firing" and obs.instance in lifetimes:
            start = lifetimes[obs.instance]
            together = sum(1 for s in lifetimes.values() if abs(s - start) <= rollout)
            firing = sorted(i for i, s in starts.items() if abs(s - start) <= rollout)
            if len(firing) >= max(FLEET_MIN, math.ceil(FLEET_SHARE * together)):
                fleet = obs.evidence.get("fleet") or {
                    "pattern": "fleet-wide",
                    "growing": firing[:50],
                    "instances": together,
                }
                obs = replace(obs, confirmed=True, evidence=obs.evidence | {"fleet": fleet})
        out.append(obs)
    return out


def _promoted(
    obs: Observation, params: DetectParams, pattern: str, growing: list[str], of: int
) -> Observation:

    ttoom = obs.evidence.get("time_to_oom_seconds")
    if pattern == "fleet-wide":
        why = f"the same growth in {len(growing)} of {of} instances of its workload since their start"
    else:
        why = f"it grows while its {of - 1} peers stay flat"
    evidence = obs.evidence | {"fleet": {"pattern": pattern, "growing": growing[:50], "instances": of}}
    return replace(
        obs,
        state="firing",
        verdict="leak",
        severity=severity_for(ttoom, params.horizon, ruled_out=False),  # peers do not rule saturation out
        summary=f"{_growth_text(obs)}; a leak: {why}",
        evidence=evidence,
    )


def _growth_text(obs: Observation) -> str:
    """The growth an observation saw, in the words of a leak finding: its own summary when it fired,
    else its figures (its summary then says why it did not fire on its own, which the peers overrule)."""
    e = obs.evidence
    slope, pct, series = e.get("slope_bytes_per_second"), e.get("pct_per_hour"), e.get("series")
    if obs.state == "firing" or not isinstance(slope, (int, float)) or not isinstance(pct, (int, float)):
        return obs.summary
    text = f"{obs.instance} grows {format_bytes(slope * 3600)}/h ({pct:.2f} %/h) in {series}"
    ttoom = e.get("time_to_oom_seconds")
    if isinstance(ttoom, (int, float)):
        text += f"; projected OOM in {format_duration(ttoom)}"
    confidence = e.get("confidence")
    return text + (f"; confidence {confidence:.3f}" if isinstance(confidence, (int, float)) else "")


def analyze_fleet(
    all_series: Iterable[InstanceSeries],
    params: DetectParams,
    prior: WorkloadProfile | Mapping[str, WorkloadProfile] | None = None,
    fleet_of: Callable[[InstanceSeries], str] | None = None,
    learn_history: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> list[InstanceAnalysis]:
    """Replay the online path over several instances at once, one fleet at a time.

    `fleet_of` names each instance's workload (default: all one fleet); `prior` is the workload's
    profile (one, or one per workload key) from peers or a Prometheus pull; with `learn_history`
    each instance also gets what its workload's samples before its latest start teach (earlier
    lifetimes, under this name or another). Results are in input order."""
    items = list(all_series)
    groups: dict[str, list[int]] = {}
    for i, series in enumerate(items):
        groups.setdefault(fleet_of(series) if fleet_of else "", []).append(i)
    results: list[InstanceAnalysis | None] = [None] * len(items)
    done = 0
    for key, members in groups.items():
        given = prior.get(key) if isinstance(prior, Mapping) else prior
        fleet = [items[i] for i in members]
        prepared = with_priors(fleet, params, given, learn_history)
        for i, analysis in zip(members, _replay(prepared, params), strict=True):
            results[i] = analysis
        done += len(members)
        if progress is not None:
            progress(done, len(items))
    return [r for r in results if r is not None]


def with_priors(
    fleet: list[InstanceSeries],
    params: DetectParams,
    given: WorkloadProfile | None,
    learn_history: bool = True,
    learned: dict[tuple[str, float], WorkloadProfile | None] | None = None,
) -> list[Prepared]:
    """The instances of one workload prepared for judging (`Prepared`), each with its prior: `given`
    (peers, Prometheus) merged with what the instance's own samples before its latest start teach
    (its earlier lifetimes), when it has restarted within them. `learned` caches those by (instance, start) across calls
    (the agent's job); the workload's other instances speak through `given`."""
    cache = learned if learned is not None else {}
    out = []
    for series in fleet:
        own = None
        plain = Prepared(series, params)
        if learn_history:
            starts = plain.starts
            if len(starts) > 1:  # a new process with the workload's earlier lifetimes before it
                cut = (series.instance, starts[-1])
                if cut not in cache:
                    if len(cache) >= MAX_LEARNED:
                        cache.clear()
                    found = learn_workload([series], params, until=starts[-1])
                    cache[cut] = replace(found, learned_until=starts[-1]) if found is not None else None
                own = cache[cut]
        prior = merge([own, given]) if own and given else (own or given)
        same = prior is series.prior
        out.append(plain if same else Prepared(replace(series, prior=prior), params, same_samples=plain))
    return out


def judge_fleet(fleet: Sequence[Prepared], tick: float, params: DetectParams) -> list[Observation]:
    """Every instance of one workload judged at `tick` (`judge`), with `fleet_evidence` applied:
    what the agent does at each judgement, and what `analyze_fleet` replays."""
    observations = [o for prep in fleet for o in judge(prep, tick)]
    return fleet_evidence(observations, params) if len(fleet) > 1 else observations


def _needs_everyone(
    per: dict[int, list[Observation]], preps: Sequence[Prepared], tick: float, params: DetectParams
) -> list[int] | None:
    """Which quiet instances (judged to nothing) the fleet's evidence needs judged in full at this
    tick to see what the agent sees; None when no promotion is possible at all. A fleet-wide leak
    needs a firing leak or oom-risk and reads the instances that started in the same rollout; one instance
    growing alone needs exactly one loud instance whose leak is not flat, and reads all."""
    leaks = [o for obs in per.values() for o in obs if o.kind == "leak"]
    quiet = [i for i, obs in per.items() if not obs]
    judged = [o for obs in per.values() for o in obs]
    firing = _starters(judged, params) + [
        o for o in judged if o.kind == "oom-risk" and o.state == "firing" and _fresh(o, params)
    ]
    rollout = _rollout(params)
    needed: set[int] = set()
    if firing:
        starts = [o.lifetime_start for o in firing]
        for i in quiet:
            life = preps[i].life_at(tick)
            start = preps[i].starts[life] if life >= 0 else math.inf
            if any(abs(start - s) <= 2 * rollout for s in starts):  # within a rollout of one within a rollout
                needed.add(i)
    loud = [o for o in leaks if not _flat(o, params)]
    if len(loud) == 1 and loud[0].state == "holding" and len(per) > PEERS_MIN:
        needed.update(quiet)
    if not firing and not needed:
        return None
    return sorted(needed)


def _replay(
    preps: Sequence[Prepared], params: DetectParams, every_tick: bool = False
) -> list[InstanceAnalysis]:
    """`analyze_instance` for every instance of one fleet, tick by tick together, with
    `fleet_evidence` applied at each tick; the ticks that see no sample are skipped unless
    `every_tick` (the reference the skipping is held to)."""
    fleet = [p.series for p in preps]
    outs = [
        InstanceAnalysis(s.instance, [], [], [], s.first_ts(), s.last_ts(), p.starts[1:])
        for s, p in zip(fleet, preps, strict=True)
    ]
    spans = [(s.first_ts(), s.last_ts()) for s in fleet]
    present = [(a, b) for a, b in spans if a is not None and b is not None]
    for out, (a, _) in zip(outs, spans, strict=True):
        if a is None:
            out.notes.append("no samples")
    if not present:
        return outs
    width = params.step
    first = min(a for a, _ in present)
    last = max(b for _, b in present)
    active: list[list[Finding]] = [[] for _ in fleet]
    opened: list[dict[str, Finding]] = [{} for _ in fleet]
    last_obs: list[list[Observation]] = [[] for _ in fleet]
    # a tick at which no instance sees a sample changes nothing; an instance that sees none and
    # has no finding is judged to nothing (`judge` with `skip_quiet` would say the same, slower)
    back, ahead = judged_reach(params)
    seen = [seen_from(s.series.values(), back, ahead) for s in fleet]
    sights = [Sight(intervals) for intervals in seen]
    anyone = union(interval for intervals in seen for interval in intervals)
    for k in replay_steps(first, last, params, anyone, every_tick):
        tick = k * width
        live = [
            i for i, (a, b) in enumerate(spans)
            if a is not None and b is not None and a < tick <= math.floor(b / width + 1e-9) * width
        ]  # fmt: skip
        per = {
            i: judge(preps[i], tick, skip_quiet=not active[i])
            if every_tick or active[i] or sights[i].sees(tick)
            else []
            for i in live
        }
        rejudge = _needs_everyone(per, preps, tick, params) if len(live) > 1 else []
        if rejudge is not None:
            for i in rejudge:
                per[i] = judge(preps[i], tick)  # quiet ones whose observations the fleet's evidence reads
            flat = fleet_evidence([o for obs in per.values() for o in obs], params)
            by_instance: dict[str, list[Observation]] = {}
            for o in flat:
                by_instance.setdefault(o.instance, []).append(o)
            per = {i: by_instance.get(fleet[i].instance, []) for i in per}
        for i, observations in per.items():
            if not observations:
                continue
            last_obs[i] = observations
            active[i], transitions = update(active[i], observations, params)
            for tr in transitions:
                outs[i].transitions.append(tr)
                opened[i][tr.finding.id] = tr.finding
                if tr.change == "opened":
                    outs[i].at_open[tr.finding.id] = tr.finding
    for i, out in enumerate(outs):
        for finding in active[i]:
            if finding.state == "open":
                opened[i][finding.id] = finding
        out.findings = sorted(opened[i].values(), key=lambda f: (f.opened_at or 0.0, f.kind))
        out.notes = out.notes or sorted(
            {f"{o.kind}: {o.summary}" for o in last_obs[i] if o.state == "unknown"}
        )
    return outs
