"""What a parse of a Prometheus exposition returns: the page's families and their samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

Format = Literal["text", "openmetrics"]


class PromSample(NamedTuple):
    """One sample line: full sample name (`x_bucket`), labels, value, timestamp in seconds or None."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


@dataclass(slots=True)
class MetricFamily:
    name: str
    type: str  # as declared by `# TYPE`; "untyped" (text) or "unknown" (OpenMetrics) when not declared
    help: str | None = None
    unit: str | None = None
    samples: list[PromSample] = field(default_factory=list)


@dataclass(slots=True)
class Exposition:
    format: Format
    families: dict[str, MetricFamily]
    declared: dict[str, str]  # every `# TYPE` line seen (also of families not parsed): name → type
    lines: int

    def family(self, name: str) -> MetricFamily | None:
        return self.families.get(name)
