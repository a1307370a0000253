"""Reading an answer from a server medic does not control: within a size and a total time.

An HTTP client's timeout applies to each network read, so a server that sends a byte now and then
(a slowloris, a broken proxy) would hold the reader for ever, and one that never stops would fill
its memory. `read_bounded` takes the body's chunks as they arrive and stops at either bound.
"""

from __future__ import annotations

import time
from collections.abc import Iterable


class AnswerTooLarge(Exception):
    """The answer passed `max_bytes`."""


class AnswerTooSlow(Exception):
    """The answer was still arriving after `seconds`."""


def read_bounded(chunks: Iterable[bytes], max_bytes: int, seconds: float) -> bytes:
    """The joined chunks, or `AnswerTooLarge` past `max_bytes`, or `AnswerTooSlow` after `seconds`."""
    deadline = time.monotonic() + seconds
    parts, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise AnswerTooLarge(max_bytes)
        if time.monotonic() > deadline:
            raise AnswerTooSlow(seconds)
        parts.append(chunk)
    return b"".join(parts)
