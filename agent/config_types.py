"""Value types shared by every config model (agent, remediation, notify): durations and sizes."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator

from agent.units import parse_duration, parse_size

Duration = Annotated[float, BeforeValidator(parse_duration)]  # `5s`, `10m`, `1h30m` → seconds
Size = Annotated[int, BeforeValidator(parse_size)]  # `512Mi`, `2G` → bytes
