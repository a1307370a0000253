"""Options shared by every subcommand, and the argument types that turn a mistyped value into a
usage error with a hint before anything runs.

The shared options are accepted before or after the subcommand (`medic --url URL status` and
`medic status --url URL`): the top parser holds their defaults, and every subcommand parser holds a
copy whose default is suppressed, so that a value given before the subcommand is not overwritten.
A subcommand may define one of them itself with its own help (`run --state-dir`, `warmup --url`).
"""

from __future__ import annotations

import argparse
import re
from typing import TypedDict

from agent.core.units import parse_duration


class OptionSpec(TypedDict, total=False):
    """The keyword arguments of one global option's `add_argument`."""

    help: str
    metavar: str
    action: str


GLOBAL_OPTIONS: list[tuple[str, OptionSpec]] = [
    (
        "--url",
        {
            "help": "agent API address (env MEDIC_URL; default: STATE_DIR/agent.json, else http://127.0.0.1:9464)"
        },
    ),
    (
        "--token-file",
        {
            "help": "file holding the agent's admin token (default: MEDIC_TOKEN, MEDIC_TOKEN_FILE, STATE_DIR/admin.token)"
        },
    ),
    (
        "--state-dir",
        {
            "metavar": "DIR",
            "help": "the agent's state_dir: its agent.json gives the URL, its admin.token the token "
            "(env MEDIC_STATE_DIR; default ./medic-state)",
        },
    ),
    ("--json", {"action": "store_true", "help": "print JSON instead of text"}),
]
GLOBAL_DESTS = frozenset(name[2:].replace("-", "_") for name, _ in GLOBAL_OPTIONS)

# a bare number where a span is expected: a unit was most likely forgotten (`--window 6`)
_BARE_NUMBER = re.compile(r"^\s*[0-9]*\.?[0-9]+\s*$")
# a bare number where a point in time may be given is a unix time only from 2001 on
_UNIX_TIME_MIN = 1e9


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """The shared options with their defaults, on the top parser."""
    group = parser.add_argument_group("global options (before or after the subcommand)")
    for flag, spec in GLOBAL_OPTIONS:
        group.add_argument(flag, **spec)


def share_global_options(parser: argparse.ArgumentParser) -> None:
    """Give `parser` and every parser nested under it the shared options, with suppressed defaults."""
    for flag, spec in GLOBAL_OPTIONS:
        if flag not in parser._option_string_actions:
            parser.add_argument(flag, **spec)
    for action in parser._actions:
        if action.dest in GLOBAL_DESTS:
            action.default = argparse.SUPPRESS
        if isinstance(action, argparse._SubParsersAction):
            for nested in action.choices.values():
                share_global_options(nested)


def duration(text: str) -> str:
    """An argparse type: a span with a unit (`30s`, `6h`, `1h30m`) or 0, returned as given."""
    if _BARE_NUMBER.match(text) and float(text) != 0:  # 0 is 0 in every unit
        number = text.strip()
        raise argparse.ArgumentTypeError(f"give a unit: {number}s, {number}m or {number}h")
    _check(text)
    return text


def free_text(value: str) -> str:
    """An argparse type for text sent to the agent (a reason): bytes of the command line that are
    not UTF-8 (Python keeps them as lone surrogates, which no JSON body can carry) become U+FFFD,
    so that the pause or restart is made, with its reason as readable as it can be."""
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that no byte of argv made
        raw = value.encode("utf-8", "replace")
    return raw.decode("utf-8", "replace")


def when(text: str) -> str:
    """An argparse type: a span ago with a unit (`1h`), or a unix time; returned as given."""
    if _BARE_NUMBER.match(text) and float(text) < _UNIX_TIME_MIN:
        number = text.strip()
        raise argparse.ArgumentTypeError(
            f"give a unit: {number}s, {number}m or {number}h ago, or a unix time such as 1700000000"
        )
    if not _BARE_NUMBER.match(text):
        _check(text)
    return text


def _check(text: str) -> None:
    try:
        parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
