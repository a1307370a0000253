"""Detectors: pure functions of in-memory series that produce findings.

Entry points (see `docs/detection.md`):

- `evaluate(series, now, params) -> list[Observation]`: one judgement of one instance (online).
- `update(active, observations, params) -> (active, transitions)`: the finding lifecycle.
- `analyze(all_series, params) -> list[InstanceAnalysis]`: the same, replayed over recordings.
"""

from agent.detect.lifecycle import update
from agent.detect.memory.engine import (
    DEFAULT_PARAMS,
    analyze,
    analyze_instance,
    evaluate,
    tick_for,
)
from agent.detect.model import Finding, InstanceAnalysis, InstanceSeries, Observation, Transition
from agent.detect.params import DetectParams

__all__ = [
    "DEFAULT_PARAMS",
    "DetectParams",
    "Finding",
    "InstanceAnalysis",
    "InstanceSeries",
    "Observation",
    "Transition",
    "analyze",
    "analyze_instance",
    "evaluate",
    "tick_for",
    "update",
]
