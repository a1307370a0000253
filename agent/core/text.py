"""Plain-text output for people: tables (left-aligned text, right-aligned numbers) and lines.

Everything printed comes partly from others: process names and command lines, hook replies, pause
reasons, Alertmanager labels. A terminal would obey the escape sequences in them (clear the screen,
rewrite the title, hide a line), so `printable` shows every control character as `\\x1b`-style text
and `render`/`echo` pass all text through it. JSON output needs none of this: `json.dumps` escapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# C0, DEL, C1, and the bidirectional overrides that reorder what a terminal shows
_CONTROLS = [*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = {
    code: _NAMED.get(chr(code), f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}") for code in _CONTROLS
}
_CELL = str.maketrans(_ESCAPES)
_LINES = str.maketrans({code: text for code, text in _ESCAPES.items() if chr(code) not in "\n\t"})


def printable(text: object, *, newlines: bool = False) -> str:
    """`text` with control characters shown escaped (`\\x1b[2J` stays visible and inert); plain spaces
    kept, newlines and tabs too when `newlines` (multi-line output), escaped otherwise (a table cell)."""
    return str(text).translate(_LINES if newlines else _CELL)


def echo(*parts: object, file: IO[str] | None = None, end: str = "\n", flush: bool = False) -> None:
    """`print` for people: the text is made `printable` (its own newlines kept)."""
    print(*(printable(part, newlines=True) for part in parts), file=file, end=end, flush=flush)


def render(headers: Sequence[str], rows: Sequence[Sequence[object]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    cells = [[printable(h) for h in headers]] + [
        ["-" if c is None else printable(c) for c in row] for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [
            cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i]) for i, cell in enumerate(row)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def held_by_text(held_by: object) -> str:
    """`held by static field Cache.ENTRIES (java.util.HashMap of 10800 entries)`, or `held by
    cache_service.CACHE (dict of 5000 int -> bytes), added at cache_service.py:16`, from a suspect's
    `held_by` (records with `where`, `what` and, for a Python container, `added_at`; or short strings);
    "" when nothing is known."""
    if not isinstance(held_by, list) or not held_by:
        return ""
    first = held_by[0]
    if isinstance(first, dict):
        where, what, added = first.get("where"), first.get("what"), first.get("added_at")
        if not where:
            return ""
        return f"held by {where}" + (f" ({what})" if what else "") + (f", added at {added}" if added else "")
    return f"held by {first}"
