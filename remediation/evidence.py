"""Evidence captured before a restart, so that the restart does not destroy what on-call needs.

The runtime injects capture callables by name (`heap_profile`, `class_histogram`, `smaps_rollup`,
`series`...): `capture(view, timeout) -> bytes | str | dict | list | Path | None`. They run in
parallel, bounded by one deadline (`timeout`) and one size budget (`max_bytes`, shared), and are
written under `<dir>/<instance>/<action id>/`, with the whole finding (id, kind, verdict, summary,
suspects, attribution, evidence) as `finding.json`; the finding counts against the size budget too.
A capture that fails or overruns is recorded as such; it never stops the restart. Only the last
`keep` restarts' evidence is kept per instance.

The directory and its sub-directories are private (0700, medic's own, never symlinks: refused
with the fix otherwise, when the store is built); each file is written under a fresh
`O_EXCL | O_NOFOLLOW` name and renamed into place, and a file a capture hands over is opened
without following symlinks.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from probes.linux.fstrust import atomic_file, atomic_write, ensure_private_dir
from remediation.model import InstanceView

CaptureFn = Callable[[InstanceView, float], "bytes | str | dict[str, Any] | list[Any] | Path | Parts | None"]


class Parts(dict[str, object]):
    """Several files from one capture, `{part: value}`, stored as `<capture>.<part>.<suffix>`
    (a heap profile: the raw dump and its symbolized sites)."""


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True, slots=True)
class EvidenceItem:
    name: str
    path: str | None
    size: int
    truncated: bool
    seconds: float
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "bytes": self.size,
            "truncated": self.truncated,
            "seconds": round(self.seconds, 3),
            "error": self.error,
        }


class EvidenceStore:
    def __init__(
        self, directory: str | Path, *, keep: int = 5, max_bytes: int = 64 * 2**20, timeout: float = 30.0
    ):
        self.directory = ensure_private_dir(directory, "evidence dir")
        self.keep = keep
        self.max_bytes = max_bytes
        self.timeout = timeout
        self._pruned: list[int] = []
        self._lock = threading.Lock()

    def capture(
        self,
        action_id: int,
        view: InstanceView,
        captures: Mapping[str, CaptureFn],
        finding: Mapping[str, Any] | None = None,
    ) -> list[EvidenceItem]:
        instance_dir = ensure_private_dir(self.directory / _SAFE.sub("_", view.name), "evidence dir")
        folder = ensure_private_dir(instance_dir / f"{action_id:08d}", "evidence dir")
        budget = self.max_bytes
        items = []
        if finding:
            item = self._write(folder, "finding", dict(finding), budget, 0.0)
            budget -= item.size
            items.append(item)
        results: dict[str, tuple[object, BaseException | None, float]] = {}

        def run(name: str, fn: CaptureFn) -> None:
            started = time.monotonic()
            try:
                results[name] = (fn(view, self.timeout), None, time.monotonic() - started)
            except BaseException as exc:  # injected code: record whatever it raises
                results[name] = (None, exc, time.monotonic() - started)

        threads = {
            name: threading.Thread(target=run, args=(name, fn), name=f"evidence-{name}", daemon=True)
            for name, fn in captures.items()
        }
        deadline = time.monotonic() + self.timeout
        for thread in threads.values():
            thread.start()
        for thread in threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        for name in sorted(captures):
            if name not in results:
                items.append(
                    EvidenceItem(name, None, 0, False, self.timeout, f"timed out after {self.timeout:g}s")
                )
                continue
            value, error, seconds = results[name]
            if error is not None:
                items.append(
                    EvidenceItem(name, None, 0, False, seconds, f"{error.__class__.__name__}: {error}")
                )
                continue
            if value is None:
                items.append(EvidenceItem(name, None, 0, False, seconds, "nothing to capture"))
                continue
            parts = value.items() if isinstance(value, Parts) else [(None, value)]
            for part, part_value in parts:
                label = name if part is None else f"{name}.{part}"
                try:
                    item = self._write(folder, label, part_value, budget, seconds)
                except OSError as exc:
                    item = EvidenceItem(
                        label, None, 0, False, seconds, f"cannot store: {exc.strerror or exc}"
                    )
                budget -= item.size
                items.append(item)
        self.prune(view.name)
        return items

    def take_pruned(self) -> list[int]:
        """The action ids whose evidence `prune` removed since the last call (their ledger rows drop it)."""
        with self._lock:
            pruned, self._pruned = self._pruned, []
        return pruned

    def _write(self, folder: Path, name: str, value: object, budget: int, seconds: float) -> EvidenceItem:
        safe = _SAFE.sub("_", name)
        if isinstance(value, Path):
            path = folder / (safe + "".join(value.suffixes[-1:]))
            with _open_regular(value) as src, atomic_file(path, 0o600) as dst:
                size = os.fstat(src.fileno()).st_size
                shutil.copyfileobj(_Limited(src, max(0, budget)), dst)
            copied = min(size, max(0, budget))
            return EvidenceItem(name, str(path), copied, copied < size, seconds)
        if isinstance(value, (dict, list)):
            data, suffix = json.dumps(value, indent=2, default=str).encode(), ".json"
        elif isinstance(value, str):
            data, suffix = value.encode("utf-8", "replace"), ".txt"
        elif isinstance(value, (bytes, bytearray)):
            data, suffix = bytes(value), ".bin"
        else:
            data, suffix = repr(value).encode(), ".txt"
        kept = data[: max(0, budget)]
        path = folder / (safe + suffix)
        atomic_write(path, kept, 0o600)
        return EvidenceItem(name, str(path), len(kept), len(kept) < len(data), seconds)

    def prune(self, instance: str) -> None:
        """Keep the evidence of the last `keep` restarts of `instance`."""
        root = self.directory / _SAFE.sub("_", instance)
        if not root.is_dir():
            return
        folders = sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit())
        for old in folders[: max(0, len(folders) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
            with self._lock:
                self._pruned.append(int(old.name))


def _open_regular(path: Path) -> BinaryIO:
    """A capture's file, read-only: a symlink is not followed, a FIFO or device is not read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(fd, "rb")


class _Limited:
    """A reader that stops after `limit` bytes."""

    def __init__(self, raw: BinaryIO, limit: int) -> None:
        self.raw, self.left = raw, limit

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        size = self.left if size < 0 else min(size, self.left)
        data = self.raw.read(size)
        self.left -= len(data)
        return data
