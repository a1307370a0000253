"""Durations and sizes as users write them in config files and on the command line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.core.units import format_bytes, format_duration, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5s", 5),
        ("250ms", 0.25),
        ("10m", 600),
        ("6h", 21600),
        ("1h30m", 5400),
        ("2d", 172800),
        ("90", 90),
        (1.5, 1.5),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5x", "h", "-5s", "5 s s", "1h-30m", "nan", "inf", True])
def test_bad_durations_name_the_accepted_forms(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512Mi", 512 * 2**20),
        ("2G", 2 * 10**9),
        ("1.5GiB", int(1.5 * 2**30)),
        ("1048576", 2**20),
        (4096, 4096),
    ],
)
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "12Q", "Mi", "-1G", "1 2G", None])
def test_bad_sizes_are_rejected(text):
    with pytest.raises((ValueError, TypeError)):
        parse_size(text)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["ms", "s", "m", "h", "d"]))
def test_duration_round_trip(number, unit):
    factor = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    assert parse_duration(f"{number}{unit}") == pytest.approx(number * factor)


@given(st.text(max_size=20))
def test_duration_parser_never_raises_anything_but_value_error(text):
    try:
        assert parse_duration(text) >= 0
    except ValueError:
        pass


@given(st.text(max_size=20))
def test_size_parser_never_raises_anything_but_value_error(text):
    try:
        assert parse_size(text) >= 0
    except ValueError:
        pass


def test_formatting_for_tables():
    assert format_bytes(None) == "-"
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**30) == "3.0 GiB"
    assert format_duration(20400) == "5h40m"
    assert format_duration(3.25) == "3.2s"
    assert format_duration(None) == "-"
