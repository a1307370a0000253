"""Durations (`5s`, `10m`, `1h30m`) and sizes (`512Mi`, `2G`) for config, CLI and display."""

from __future__ import annotations

import math
import re

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_duration(value: str | int | float) -> float:
    """Seconds from `90`, `1.5`, `250ms`, `5s`, `10m`, `1h30m`, `2d`; raises ValueError with the accepted forms."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m, 6h, got a boolean")
    if isinstance(value, (int, float)):
        seconds = float(value) if abs(value) < 1e300 else math.inf  # a huge int would overflow float()
    else:
        text = str(value).strip().lower()
        if not text:
            raise ValueError("expected a duration such as 30s, 5m, 6h, got an empty string")
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _DURATION_PART.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
                pos = match.end()
            if pos != len(text) or pos == 0:
                raise ValueError(
                    f"expected a duration such as 30s, 5m, 6h or 1h30m (units ms s m h d w), got {value!r}"
                ) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"expected a finite, non-negative duration, got {value!r}")
    return seconds


def parse_size(value: str | int | float) -> int:
    """Bytes from `1048576`, `512Mi`, `2G`, `1.5GiB`; raises ValueError with the accepted forms."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 512Mi or 2G, got a boolean")
    if isinstance(value, (int, float)):
        number, unit = (float(value) if abs(value) < 1e300 else math.inf), ""
    else:
        match = _SIZE.match(str(value))
        if not match:
            raise ValueError(f"expected a size such as 512Mi, 2G or 1048576 (bytes), got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
        if unit not in _SIZE_UNITS:
            raise ValueError(
                f"unknown size unit {match.group(2)!r} in {value!r}: use B, K, M, G, T (powers of 1000) "
                "or Ki, Mi, Gi, Ti (powers of 1024)"
            )
    if not math.isfinite(number * _SIZE_UNITS[unit]) or number < 0:
        raise ValueError(f"expected a finite, non-negative size, got {value!r}")
    return int(number * _SIZE_UNITS[unit])


def format_bytes(value: float | None) -> str:
    """`1.5 GiB` style, for tables; `-` for unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    sign = "-" if value < 0 else ""
    value = abs(float(value))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_rate(bytes_per_second: float | None) -> str:
    """`12.0 MiB/min` style: per second, per minute or per hour, the shortest that reads as at least 1 MiB
    (per hour below that)."""
    if bytes_per_second is None or not math.isfinite(bytes_per_second):
        return "-"
    if abs(bytes_per_second) >= 2**20:
        return f"{format_bytes(bytes_per_second)}/s"
    if abs(bytes_per_second) * 60 >= 2**20:
        return f"{format_bytes(bytes_per_second * 60)}/min"
    return f"{format_bytes(bytes_per_second * 3600)}/h"


def format_duration(seconds: float | None) -> str:
    """`3d4h`, `5h40m`, `12m3s`, `45s`, `-` for unknown: two most significant units."""
    if seconds is None or (isinstance(seconds, float) and not math.isfinite(seconds)):
        return "-"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 10:
        return f"{seconds:.1f}s"
    total = int(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if total >= size or (unit == "s" and not parts):
            parts.append(f"{total // size}{unit}")
            total %= size
        if len(parts) == 2:
            break
    return "".join(parts)


def format_fine_duration(seconds: float) -> str:
    """`170ms`, `2.5s`, `2m30s`: `format_duration`, in milliseconds under a second (a compressed
    window often is)."""
    return f"{seconds * 1000:.3g}ms" if 0 < seconds < 1 else format_duration(seconds)
