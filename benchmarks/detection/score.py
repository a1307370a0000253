"""Score medic's leak detector against `predict_linear` and monit-style alerts on the corpus.

    python -m benchmarks.detection.score            # the table, per trace and in total
    python -m benchmarks.detection.score --check    # exit 1 unless the acceptance criteria hold

Then the fresh fleets after a deploy (`fleets.py`, scored by `score_fleets.py`) and the slow
traces (`slow_traces.py`), each family's table against `predict_linear`, and their goals.

For each detector: on a non-leak trace every alert is a false positive; on a leak trace an
alert before the onset is a false positive, the first alert after it a true positive if it
comes before the OOM (else a miss). Delay is alert minus onset; `frac` is the delay as a
fraction of the time from onset to OOM. Medians count a miss as the whole onset-to-end time.
medic's alert is a `leak` finding opening; its `oom-risk` and `fragmentation` findings are
listed too but not scored.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field

from agent.core.units import format_duration
from agent.detect import DetectParams, InstanceSeries, analyze_instance
from benchmarks.detection import score_fleets, slow_traces
from benchmarks.detection.baselines import monit_alert, predict_linear_alert
from benchmarks.detection.corpus import all_traces
from benchmarks.detection.generate import Trace

DETECTORS = ("medic", "predict_linear", "monit")


@dataclass
class Outcome:
    fp: int = 0
    tp: bool = False
    miss: bool = False
    delay: float | None = None
    frac: float | None = None


@dataclass
class Row:
    trace: Trace
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    others: str = ""


def medic_alerts(trace: Trace, params: DetectParams) -> tuple[list[float], str]:
    series = InstanceSeries(
        trace.name,
        {"rss_bytes": trace.points, **trace.extra},
        restarts=trace.restarts,
        memory_limit=trace.limit,
    )
    result = analyze_instance(series, params)
    leaks = sorted(f.opened_at for f in result.findings if f.kind == "leak" and f.opened_at is not None)
    others = [
        f"{f.kind}:{f.verdict or '-'}@{format_duration(f.opened_at - trace.start)}"
        for f in result.findings
        if f.kind != "leak" and f.opened_at is not None
    ]
    return leaks, " ".join(others)


def judge(trace: Trace, alerts: list[float]) -> Outcome:
    out = Outcome()
    if not trace.leak:
        out.fp = len(alerts)
        return out
    assert trace.onset is not None
    out.fp = sum(1 for a in alerts if a < trace.onset)
    after = [a for a in alerts if a >= trace.onset]
    end = trace.oom if trace.oom is not None else trace.end
    if after and (trace.oom is None or after[0] < trace.oom):
        out.tp = True
        out.delay = after[0] - trace.onset
    else:
        out.miss = True
    if trace.oom is not None and trace.oom > trace.onset:
        out.frac = (out.delay if out.delay is not None else end - trace.onset) / (trace.oom - trace.onset)
    return out


def score(traces: list[Trace], params: DetectParams) -> list[Row]:
    rows = []
    for trace in traces:
        row = Row(trace)
        medic, row.others = medic_alerts(trace, params)
        row.outcomes["medic"] = judge(trace, medic)
        row.outcomes["predict_linear"] = judge(trace, predict_linear_alert(trace.points, trace.limit))
        row.outcomes["monit"] = judge(trace, monit_alert(trace.points, trace.limit))
        rows.append(row)
    return rows


def _cell(o: Outcome, leak: bool) -> str:
    if not leak:
        return "ok" if not o.fp else f"FP×{o.fp}"
    text = (
        f"{format_duration(o.delay)} ({o.frac:.2f})"
        if o.tp and o.frac is not None
        else format_duration(o.delay)
    )
    if o.miss:
        text = "MISS"
    return text + (f" +FP×{o.fp}" if o.fp else "")


def summarize(rows: list[Row]) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = {}
    leak_rows = [r for r in rows if r.trace.leak]
    for name in DETECTORS:
        outs = [r.outcomes[name] for r in rows]
        delays = []
        fracs = []
        for r in leak_rows:
            o = r.outcomes[name]
            end = r.trace.oom if r.trace.oom is not None else r.trace.end
            delays.append(o.delay if o.tp else end - r.trace.onset)
            if o.frac is not None:
                fracs.append(o.frac)
        totals[name] = {
            "tp": sum(o.tp for o in outs),
            "miss": sum(o.miss for o in outs),
            "oom_missed": sum(1 for r in leak_rows if r.trace.oom is not None and r.outcomes[name].miss),
            "fp_traces": sum(1 for r in rows if r.outcomes[name].fp),
            "fp_alerts": sum(o.fp for o in outs),
            "median_delay": statistics.median(delays) if delays else float("nan"),
            "median_frac": statistics.median(fracs) if fracs else float("nan"),
        }
    return totals


def render(rows: list[Row]) -> str:
    lines = []
    header = f"{'trace':<28} {'label':<6} {'onset→OOM':>10}  {'medic':<22} {'predict_linear':<22} {'monit':<18} medic other findings"
    lines.append(header)
    lines.append("-" * len(header))
    for r in rows:
        t = r.trace
        span = (
            format_duration(t.oom - t.onset) if t.leak and t.oom is not None and t.onset is not None else "-"
        )
        lines.append(
            f"{t.name:<28} {'leak' if t.leak else 'ok':<6} {span:>10}  "
            f"{_cell(r.outcomes['medic'], t.leak):<22} {_cell(r.outcomes['predict_linear'], t.leak):<22} "
            f"{_cell(r.outcomes['monit'], t.leak):<18} {r.others}"
        )
    totals = summarize(rows)
    leaks = sum(1 for r in rows if r.trace.leak)
    ooms = sum(1 for r in rows if r.trace.leak and r.trace.oom is not None)
    lines.append("")
    lines.append(
        f"{len(rows)} traces: {leaks} leaks ({ooms} reach OOM), {len(rows) - leaks} without a leak; "
        "delay = alert - onset (fraction of onset→OOM)"
    )
    lines.append(
        f"{'detector':<16} {'TP':>4} {'miss':>5} {'OOM missed':>10} {'FP traces':>10} {'FP alerts':>10} {'median delay':>13} {'median frac':>12}"
    )
    for name, t in totals.items():
        lines.append(
            f"{name:<16} {t['tp']:>4.0f} {t['miss']:>5.0f} {t['oom_missed']:>10.0f} {t['fp_traces']:>10.0f} "
            f"{t['fp_alerts']:>10.0f} {format_duration(t['median_delay']):>13} {t['median_frac']:>12.2f}"
        )
    return "\n".join(lines)


def acceptance(rows: list[Row]) -> list[str]:
    """The acceptance criteria that fail (empty when all hold)."""
    totals = summarize(rows)
    medic, baseline = totals["medic"], totals["predict_linear"]
    failures = []
    if medic["fp_alerts"]:
        failures.append(f"medic has {medic['fp_alerts']:.0f} false positives")
    if medic["oom_missed"]:
        failures.append(f"medic missed {medic['oom_missed']:.0f} leaks before their OOM")
    if medic["median_delay"] > 0.5 * baseline["median_delay"]:
        failures.append("medic's median delay is more than half of predict_linear's")
    if medic["fp_alerts"] > baseline["fp_alerts"]:
        failures.append("medic has more false positives than predict_linear")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3, help="generated traces per scenario")
    parser.add_argument("--only", help="score only traces whose name contains this")
    parser.add_argument("--check", action="store_true", help="exit 1 unless the acceptance criteria hold")
    parser.add_argument("--fleet-seeds", type=int, default=1, help="fresh fleets per family and prior")
    parser.add_argument("--no-fleets", action="store_true", help="skip the fresh fleets and the slow traces")
    args = parser.parse_args()
    traces = [t for t in all_traces(args.seeds) if not args.only or args.only in t.name]
    rows = score(traces, DetectParams())
    print(render(rows))
    failures = acceptance(rows)
    print("\nacceptance: " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)))
    if not args.no_fleets:
        print("\nfresh fleets after a deploy (first leak or oom-risk finding per instance):")
        met = score_fleets.main(args.fleet_seeds)
        failures += [goal for goal, ok, _ in met if not ok]
        print("\nslow traces (first slow finding per instance):")
        met = slow_traces.main()
        failures += [goal for goal, ok, _ in met if not ok]
    return 1 if args.check and failures else 0


if __name__ == "__main__":
    sys.exit(main())
