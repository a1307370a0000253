"""Score medic on fresh fleets after a deploy (`fleets.py`) against `predict_linear`, and check the goals.

    python -m benchmarks.detection.score_fleets           # also run by `python -m benchmarks.detection.score`

medic judges each fleet as `medic analyze` does (one fleet per workload, the previous build's
week as priors when the family has one); its alert on an instance is the first `leak` or
`oom-risk` finding that opens after the deploy. On a healthy instance every finding is a false
positive (before the deploy too); on a leaking one the first finding after the deploy is a hit
if it comes before the OOM. `frac` is the time from the deploy to the finding over the time
from the deploy to the OOM.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from agent.core.units import format_duration
from agent.detect import DetectParams, InstanceSeries
from agent.detect.memory.fleet import analyze_fleet
from agent.detect.memory.priors import learn_workload
from benchmarks.detection.baselines import predict_linear_alert
from benchmarks.detection.fleets import FAMILIES, PRIORS, Fleet, fleets
from benchmarks.detection.generate import Trace

GOAL_WITH_PRIOR = 0.5
GOAL_NO_PRIOR = 0.7
ALERT_KINDS = ("leak", "oom-risk")


@dataclass
class Cell:
    """One detector on one family under one kind of prior."""

    leaks: int = 0
    hits: int = 0
    ooms_missed: int = 0
    fp: int = 0
    fracs: list[float] = field(default_factory=list)
    warnings: list[float] = field(default_factory=list)  # seconds between the finding and the OOM


def to_series(trace: Trace) -> InstanceSeries:
    return InstanceSeries(
        trace.name,
        {"rss_bytes": trace.points, **trace.extra},
        restarts=trace.restarts,
        memory_limit=trace.limit,
    )


def medic_alerts(fleet: Fleet, params: DetectParams) -> dict[str, list[float]]:
    """instance -> opening times of its leak and oom-risk findings, judged as one fleet."""
    priors = None
    if fleet.previous:
        priors = learn_workload([to_series(t) for t in fleet.previous], params)
    results = analyze_fleet([to_series(t) for t in fleet.traces], params, prior=priors)
    return {
        r.instance: sorted(
            f.opened_at for f in r.findings if f.kind in ALERT_KINDS and f.opened_at is not None
        )
        for r in results
    }


def _judge(cell: Cell, trace: Trace, alerts: list[float], deploy: float) -> None:
    if not trace.leak:
        cell.fp += len(alerts)
        return
    cell.leaks += 1
    cell.fp += sum(1 for a in alerts if a < deploy)
    after = [a for a in alerts if a >= deploy]
    assert trace.oom is not None, f"{trace.name}: a leak that never reaches its limit"
    if after and after[0] < trace.oom:
        cell.hits += 1
        cell.fracs.append((after[0] - deploy) / (trace.oom - deploy))
        cell.warnings.append(trace.oom - after[0])
    else:
        cell.ooms_missed += 1
        cell.fracs.append(1.0)
        cell.warnings.append(0.0)


def score(all_fleets: list[Fleet], params: DetectParams) -> dict[tuple[str, str], dict[str, Cell]]:
    table: dict[tuple[str, str], dict[str, Cell]] = {}
    for fleet in all_fleets:
        cells = table.setdefault((fleet.family, fleet.prior), {"medic": Cell(), "predict_linear": Cell()})
        medic = medic_alerts(fleet, params)
        for trace in fleet.traces:
            _judge(cells["medic"], trace, medic.get(trace.name, []), fleet.deploy)
            _judge(
                cells["predict_linear"], trace, predict_linear_alert(trace.points, trace.limit), fleet.deploy
            )
    return table


def _frac(cell: Cell) -> str:
    if not cell.fracs:
        return "-"
    return f"{statistics.median(cell.fracs):.2f} (max {max(cell.fracs):.2f})"


def render(table: dict[tuple[str, str], dict[str, Cell]]) -> str:
    header = (
        f"{'family':<16} {'prior':<8} {'detector':<15} {'leaks':>5} {'found':>5} {'OOM missed':>10} "
        f"{'FP':>4} {'frac median (max)':>18} {'least warning':>14}"
    )
    lines = [header, "-" * len(header)]
    for (family, prior), cells in table.items():
        for name, cell in cells.items():
            least = format_duration(min(cell.warnings)) if cell.warnings else "-"
            lines.append(
                f"{family:<16} {prior:<8} {name:<15} {cell.leaks:>5} {cell.hits:>5} {cell.ooms_missed:>10} "
                f"{cell.fp:>4} {_frac(cell):>18} {least:>14}"
            )
    return "\n".join(lines)


def goals(table: dict[tuple[str, str], dict[str, Cell]]) -> list[tuple[str, bool, str]]:
    """(goal, met, figures) for the fresh-fleet goals."""
    out = []
    medic = {key: cells["medic"] for key, cells in table.items()}
    leaks = [c for (f, _), c in medic.items() if FAMILIES[f][0]]
    missed = sum(c.ooms_missed for c in leaks)
    out.append(
        (
            "every leak found before its limit",
            missed == 0,
            f"{missed} of {sum(c.leaks for c in leaks)} missed",
        )
    )
    for label, priors, bound in (("with priors", ("history", "peers"), GOAL_WITH_PRIOR),
                                 ("with no prior", ("none",), GOAL_NO_PRIOR)):  # fmt: skip
        fracs = [x for (f, p), c in medic.items() if FAMILIES[f][0] and p in priors for x in c.fracs]
        worst = max(fracs) if fracs else float("nan")
        out.append((f"{label}: first finding by {bound:.0%} of deploy->OOM", worst <= bound,
                    f"worst {worst:.2f}, median {statistics.median(fracs):.2f}" if fracs else "no leaks"))  # fmt: skip
    fp = {f"{f}/{p}": c.fp for (f, p), c in medic.items() if c.fp}
    out.append(("zero false findings on the healthy fresh fleets (and healthy pods of leaking ones)", not fp,
                ", ".join(f"{k} {v}" for k, v in fp.items()) or "0"))  # fmt: skip
    return out


def main(seeds: int = 1) -> list[tuple[str, bool, str]]:
    params = DetectParams()
    table = score(fleets(seeds, PRIORS), params)
    print(render(table))
    met = goals(table)
    print()
    for goal, ok, figures in met:
        print(f"goal {'MET ' if ok else 'NOT MET'}: {goal}: {figures}")
    return met


if __name__ == "__main__":
    main()
