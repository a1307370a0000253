"""Reading what medic does not control within bounds: an answer from a server (a size and a total
time) and a file someone names (a size, and never a FIFO or a device that would block or not end).

An HTTP client's timeout applies to each network read, so a server that sends a byte now and then
(a slowloris, a broken proxy) would hold the reader for ever, and one that never stops would fill
its memory. `read_bounded` takes the body's chunks as they arrive and stops at either bound.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Iterable
from typing import Any

from agent.core.errors import UnsafePath


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


BODY_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})  # of the body as sent


def bounded_request(
    client: Any, method: str, url: str, *, max_bytes: int, seconds: float, **kwargs: Any
) -> Any:
    """`client.request(method, url, **kwargs)` (an `httpx.Client`, or the `httpx` module) with the
    answer read by `read_bounded`. Past `max_bytes` it raises `httpx.RemoteProtocolError`, after
    `seconds` `httpx.ReadTimeout`: what callers already handle as a broken or silent server."""
    import httpx

    with client.stream(method, url, **kwargs) as streamed:
        try:
            raw = read_bounded(streamed.iter_bytes(), max_bytes, seconds)
        except AnswerTooSlow:
            raise httpx.ReadTimeout(f"still answering after {seconds:g}s", request=streamed.request) from None
        except AnswerTooLarge:
            raise httpx.RemoteProtocolError(
                f"answered more than {max_bytes} bytes", request=streamed.request
            ) from None
        headers = [(k, v) for k, v in streamed.headers.items() if k.lower() not in BODY_HEADERS]
        return httpx.Response(streamed.status_code, headers=headers, content=raw, request=streamed.request)


def read_regular_file(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The contents of a file the config names (symlinks followed: a Kubernetes ConfigMap or Secret
    is one), refused with `UnsafePath` before anything blocks when it is a FIFO, socket or device,
    and when it holds more than `max_bytes`. OSError as `open` raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePath(f"{path} is not a regular file (a FIFO, socket or device): not read")
        data = b""
        while len(data) <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > max_bytes:
            raise UnsafePath(f"{path} holds more than {max_bytes} bytes: not read")
        return data
    finally:
        os.close(fd)
