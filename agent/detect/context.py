"""What every detector needs to know about one instance at one tick."""

from __future__ import annotations

from agent.detect.growth import Fit, fits, peak
from agent.detect.model import RSS, Kind, Observation, Severity, State, Verdict
from agent.detect.params import DetectParams
from agent.detect.prepared import Prepared


class Context:
    __slots__ = ("_fits", "_peak", "life", "prep", "tick")

    def __init__(self, prep: Prepared, life: int, tick: float) -> None:
        self.prep = prep
        self.life = life
        self.tick = tick
        self._fits: dict[str, list[Fit]] = {}
        self._peak: float | bool | None = False

    @classmethod
    def at(cls, prep: Prepared, tick: float) -> Context | None:
        life = prep.life_at(tick)
        return None if life < 0 else cls(prep, life, tick)

    @property
    def params(self) -> DetectParams:
        return self.prep.params

    @property
    def limit(self) -> float | None:
        return self.prep.limit_at(self.tick)

    @property
    def peak(self) -> float | None:
        """Where the RSS peaks are now."""
        if self._peak is False:
            self._peak = peak(self.prep, RSS, self.life, self.tick)
        return self._peak  # type: ignore[return-value]

    @property
    def lifetime_start(self) -> float:
        return self.prep.starts[self.life]

    def present(self, metric: str) -> bool:
        """Whether `metric` has samples in the current lifetime before this tick."""
        return self.prep.first_in_life(metric, self.life) < self.tick

    def fits(self, metric: str) -> list[Fit]:
        found = self._fits.get(metric)
        if found is None:
            found = self._fits[metric] = fits(self.prep, metric, self.life, self.tick)
        return found

    def observation(
        self,
        kind: Kind,
        state: State,
        summary: str,
        severity: Severity = "info",
        verdict: Verdict | None = None,
        evidence: dict | None = None,
    ) -> Observation:
        return Observation(
            instance=self.prep.instance,
            kind=kind,
            state=state,
            tick=self.tick,
            lifetime_start=self.lifetime_start,
            summary=summary,
            severity=severity,
            verdict=verdict,
            evidence=evidence or {},
        )
