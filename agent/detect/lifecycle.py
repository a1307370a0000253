"""Finding lifecycle with hysteresis, as a pure function: pending → open → resolved.

A finding opens after `open_after` firing judgements with no clear one in between (at once when
it is critical: an OOM within a quarter of the horizon cannot wait for confirmation; or when the
fleet confirms it: several instances of its rollout firing at once are a stronger confirmation
than one series firing twice), and
resolves after `resolve_after` clear judgements in a row; `holding` judgements (between the two
confidence thresholds) change nothing, so a finding near the threshold does not flap. A new
process lifetime resolves the findings of the old one: the restart was the remedy.

Streaks count distinct judgement ticks, not calls: the agent may call `update` as often as it
likes (a repeated tick is ignored), and a replay that calls it once per tick gets the same
findings at the same times.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from agent.detect.model import Finding, Observation, Transition
from agent.detect.params import DetectParams

EXPLANATION_KEYS = (
    "suspects",
    "attribution",
    "collecting",
)  # added by the detection job, not by the detectors


def update(
    findings: Iterable[Finding], observations: Iterable[Observation], params: DetectParams
) -> tuple[list[Finding], list[Transition]]:
    """Apply one round of observations to the active (pending and open) findings.

    Returns the new active findings and the transitions to record as events; a resolved
    finding leaves the active list and appears in its `resolved` transition. Inputs are not
    modified.
    """
    active = {(f.instance, f.kind): replace(f, evidence=dict(f.evidence)) for f in findings}
    transitions: list[Transition] = []
    for obs in observations:
        key = (obs.instance, obs.kind)
        finding = active.get(key)
        if finding is not None and obs.lifetime_start > finding.lifetime_start:
            del active[key]
            if finding.state == "open":
                transitions.append(_resolve(finding, obs.tick, "the process restarted", None))
            finding = None
        if finding is not None and obs.tick <= finding.last_tick:
            continue
        if obs.state == "firing":
            finding = _fire(finding, obs, params, transitions)
            active[key] = finding
        elif finding is None:
            continue
        elif obs.state == "holding":
            finding.clear_streak = 0
            finding.last_tick = obs.tick
        elif obs.state == "clear":
            finding.last_tick = obs.tick
            if finding.state == "pending":
                del active[key]
                continue
            finding.clear_streak += 1
            if finding.clear_streak >= params.resolve_after:
                del active[key]
                transitions.append(_resolve(finding, obs.tick, obs.summary, obs.verdict))
    return list(active.values()), transitions


def _fire(finding: Finding | None, obs: Observation, params: DetectParams, out: list[Transition]) -> Finding:
    if finding is None:
        finding = Finding(
            id=f"{obs.instance}:{obs.kind}:{int(obs.tick)}",
            instance=obs.instance,
            kind=obs.kind,
            severity=obs.severity,
            state="pending",
            first_seen=obs.tick,
            opened_at=None,
            updated_at=obs.tick,
            resolved_at=None,
            summary=obs.summary,
            verdict=obs.verdict,
            evidence=dict(obs.evidence),
            lifetime_start=obs.lifetime_start,
        )
    before = (finding.severity, finding.verdict)
    finding.fire_streak += 1
    finding.clear_streak = 0
    finding.last_tick = obs.tick
    finding.updated_at = obs.tick
    finding.summary = obs.summary
    finding.severity = obs.severity
    finding.verdict = obs.verdict
    # the judgement's figures replace the last ones; what names the culprit stays until it is refreshed
    kept = {key: finding.evidence[key] for key in EXPLANATION_KEYS if key in finding.evidence}
    finding.evidence = dict(obs.evidence) | kept
    if finding.state == "pending" and (
        finding.fire_streak >= params.open_after or obs.severity == "critical" or obs.confirmed
    ):
        finding.state = "open"
        finding.opened_at = obs.tick
        out.append(Transition("opened", replace(finding), obs.tick, obs.summary))
    elif finding.state == "open" and (finding.severity, finding.verdict) != before:
        out.append(
            Transition(
                "updated",
                replace(finding),
                obs.tick,
                f"severity {before[0]} -> {finding.severity}, "
                f"verdict {before[1]} -> {finding.verdict}: {obs.summary}",
            )
        )
    return finding


def _resolve(finding: Finding, tick: float, reason: str, verdict: str | None) -> Transition:
    finding.state = "resolved"
    finding.resolved_at = tick
    finding.last_tick = tick
    if verdict is not None:
        finding.verdict = verdict  # e.g. the growth turned out to be a working set reaching its plateau
    return Transition("resolved", replace(finding), tick, reason)
