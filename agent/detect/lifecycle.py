"""Finding lifecycle with hysteresis, as a pure function: pending → open → resolved.

A finding opens after `open_after` firing judgements with no clear one in between (at once when
it is critical: an OOM within a quarter of the horizon cannot wait for confirmation; or when the
fleet confirms it: several instances of its rollout firing at once are a stronger confirmation
than one series firing twice), and
resolves after `resolve_after` clear judgements in a row; `holding` judgements (between the two
confidence thresholds) change nothing, so a finding near the threshold does not flap, until the
projection of its last firing judgement is refuted: its OOM was due and did not come, and
`resolve_after` judgements have passed since with none firing (`_refuted`). A process swelling on
its first fill and then holding its level, its daily rises not allowed to speak, would otherwise
keep a false finding open for days, and a leak starting later would be taken for it. A new
process lifetime resolves the findings of the old one: the restart was the remedy (the agent does
so as soon as it sees the new process, `restarted`, rather than at the next judgement).

Streaks count distinct judgement ticks, not calls: the agent may call `update` as often as it
likes (a repeated tick is ignored), and a replay that calls it once per tick gets the same
findings at the same times.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace

from agent.core.units import format_bytes, format_duration
from agent.detect.model import Finding, Observation, Transition, Verdict
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
            refuted = _refuted(finding, obs.tick, params)
            if refuted is not None:
                del active[key]
                if finding.state == "open":
                    transitions.append(_resolve(finding, obs.tick, f"{refuted}; {obs.summary}", None))
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


RESTART_TOLERANCE = 1.0  # a process that started this long after a finding's lifetime is another one
MEMORY_KINDS = ("leak", "oom-risk", "fragmentation")


def earlier_process(instance: str, lifetime_start: float, starts: Mapping[str, float]) -> bool:
    """Whether a lifetime of `instance` began before the process it runs now (`starts`) started:
    a judgement or a finding about it speaks of a process that is gone."""
    start = starts.get(instance)
    return start is not None and start > lifetime_start + RESTART_TOLERANCE


def restarted(
    findings: Iterable[Finding], starts: Mapping[str, float], now: float
) -> tuple[list[Finding], list[Transition]]:
    """Memory findings about a process the instance no longer runs (`starts`: the process each
    instance runs now), resolved at once with the verdict the next judgement would give ("the process
    restarted"), without waiting for it: until the new process is measured its time to OOM is
    unknown, and no view may go on showing the old one's. Returns (the findings kept, transitions)."""
    kept: list[Finding] = []
    transitions: list[Transition] = []
    for finding in findings:
        if finding.kind in MEMORY_KINDS and earlier_process(finding.instance, finding.lifetime_start, starts):
            if finding.state == "open":
                transitions.append(_resolve(replace(finding), now, "the process restarted", None))
            continue
        kept.append(finding)
    return kept, transitions


def past_the_limit(findings: Iterable[Finding]) -> list[Finding]:
    """Findings as they stand once an instance's peaks are past its limit (its open oom-risk finding
    says `above_limit`): the OOM its open leak finding projected (as of its last firing judgement,
    "in 0.5s") has come, so the leak finding carries the oom-risk's time to OOM instead (0 at an
    enforced limit, unknown past a config-only one) and its summary says the limit was reached, so
    no view goes on counting down to an OOM that is past. A finding's own judgement replaces it when
    it fires again."""
    findings = list(findings)
    above = {
        f.instance: f
        for f in findings
        if f.kind == "oom-risk" and f.state == "open" and f.evidence.get("above_limit")
    }
    out = []
    for finding in findings:
        past = above.get(finding.instance)
        if past is not None and finding.kind == "leak" and not finding.evidence.get("above_limit"):
            limit = past.evidence.get("limit_bytes")
            reached = f"; its peaks have since reached its limit {format_bytes(limit)}" if limit else ""
            finding = replace(
                finding,
                summary=_PROJECTION.sub(reached, finding.summary),
                evidence=finding.evidence
                | {"time_to_oom_seconds": past.evidence.get("time_to_oom_seconds"), "above_limit": True},
            )
        out.append(finding)
    return out


_PROJECTION = re.compile(r"; projected OOM in [^;]+")


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
    finding.verdict = _verdict(finding, obs, params)
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


def _verdict(finding: Finding, obs: Observation, params: DetectParams) -> Verdict | None:
    """The verdict after a firing judgement. A shown finding keeps its verdict until another has
    been judged `open_after` times in a row (as much evidence as opening a finding takes): a
    judgement without one, or one challenger among the old verdict's judgements, changes nothing,
    so what remediation reads does not flip with each judgement. A pending finding, or one with no
    verdict yet, takes the judgement's."""
    new = obs.verdict
    if finding.state != "open" or finding.verdict is None:
        finding.challenger, finding.challenger_streak = None, 0
        return new
    if new is None or new == finding.verdict:
        finding.challenger, finding.challenger_streak = None, 0
        return finding.verdict
    finding.challenger_streak = finding.challenger_streak + 1 if finding.challenger == new else 1
    finding.challenger = new
    if finding.challenger_streak < params.open_after:
        return finding.verdict
    finding.challenger, finding.challenger_streak = None, 0
    return new


def _refuted(finding: Finding, tick: float, params: DetectParams) -> str | None:
    """Why a holding finding's projection no longer stands, or None: the OOM its last firing judgement
    projected was due, the process lives on, and since then as many judgements as resolving takes
    (`resolve_after`) have passed with none firing. A finding without a projection (not reaching the
    limit, or already above it) has nothing to refute and holds."""
    ttoom = finding.evidence.get("time_to_oom_seconds")
    if not isinstance(ttoom, (int, float)) or not 0 < ttoom < math.inf:
        return None
    waited = tick - finding.updated_at
    if waited < ttoom + params.resolve_after * params.step:
        return None
    return (
        f"the OOM projected {format_duration(ttoom)} after the last firing judgement did not come, and "
        f"no judgement has confirmed the growth in the {format_duration(waited)} since"
    )


def _resolve(finding: Finding, tick: float, reason: str, verdict: Verdict | None) -> Transition:
    finding.state = "resolved"
    finding.resolved_at = tick
    finding.last_tick = tick
    if verdict is not None:
        finding.verdict = verdict  # e.g. the growth turned out to be a working set reaching its plateau
    return Transition("resolved", replace(finding), tick, reason)
