"""Regular expressions from the config that read text other people write (command lines of every
process on the host, alert names from Prometheus): matched in linear time by RE2.

Python's `re` backtracks: `A.*B` against a 700 KB command line that an unprivileged process wrote
takes tens of seconds, during which the agent's loop stands still (no probe, no `/healthz`). RE2
(the `google-re2` binding) takes time proportional to the text, whatever the pattern, and refuses
what it cannot do in that time (backreferences, lookaround); such a pattern is a config error that
says how to write it instead. RE2 also reads `\\d`, `\\w` and `\\s` as ASCII classes.
"""

from __future__ import annotations

from typing import Any, Protocol

# RE2 builds its automaton within this much memory; a larger pattern is refused when compiled
MAX_PATTERN_MEMORY = 8 * 2**20
HOWTO = (
    "patterns are matched by RE2, in time linear in the text: write it without backreferences "
    "(\\1) and lookaround ((?=…), (?!…), (?<=…)), and use \\z for the end of the text"
)


class Pattern(Protocol):
    pattern: str

    def search(self, text: str) -> Any: ...


class PatternError(ValueError):
    """A pattern RE2 cannot take (or a pattern that is no regular expression at all)."""


def compile_pattern(text: str) -> Pattern:
    """`text` compiled by RE2; `PatternError` says what is wrong and how to write it."""
    try:
        import re2  # type: ignore[import-untyped]  # google-re2 ships no type information
    except ImportError:  # a declared dependency: only a broken install lacks it
        raise PatternError(
            "the google-re2 package is not installed (pip install 'google-re2'); medic matches "
            "patterns with it"
        ) from None
    options = re2.Options()
    options.log_errors = False  # the error comes back as an exception, not as a line on stderr
    options.max_mem = MAX_PATTERN_MEMORY
    try:
        compiled: Pattern = re2.compile(text, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else str(exc)
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(f"invalid regular expression {text!r}: {reason}; {HOWTO}") from None
    return compiled
