"""What holds a JVM heap leak, in the JVM's own words: a JFR recording of old-object samples, dumped with
the chain of references from each sample to its GC root (docs/histograms.md, "What holds it").

When a leak finding opens on a JVM instance (`histograms.jvm.retainers.on_leak`), the `jvm` probe's
next run starts a recording of the old-object sampler alone, in memory (`JFR.start name=medic-retainers
settings=none +jdk.OldObjectSample#enabled=true disk=false duration=…`: it stops itself a while after
`record` should medic not be there to stop it). Objects the leak allocates meanwhile and keeps are
sampled. After `record`, one jcmd run dumps the recording with the paths to the GC roots into jcmd's
private directory (the JVM's user's, 0700) and stops it; `jfr print`, beside the trusted jcmd and run as
the JVM's user, reads the dump; the directory is removed. Nothing stays behind but the JFR threads
the JVM keeps once it has recorded, as it keeps the attach listener once jcmd has attached. The dump
takes a pause of a few ms to find the paths (the JVM bounds it).

The samples become a `retainer` snapshot (source `jfr`): one row per holder (`static field
MapLeak.CACHE`), its count the samples it holds, its detail the container it holds
(`java.util.HashMap of 10800 entries`) and the classes below it on the chains. The suspects say it
(`held_by`, agent/detect/explain/retainers.py). The JVM writes the dump by the path it is given, so a JVM in
another mount namespace (a container) is not recorded: the probe says so once.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import ProbeError, TargetGone, UnsafePath
from agent.core.histograms import HistogramRow, Snapshot
from agent.core.records import ProbeResult, ProbeTarget
from probes.jcmd import run_jcmd, same_mount_namespace
from probes.jfrtext import OldObject, parse_old_objects, retainer
from probes.linux.fstrust import check_trusted_path
from probes.linux.helpers import RunAs
from probes.linux.procfs import HOST_ROOT
from probes.settings import JvmHistograms

NAME = "medic-retainers"
DUMP = "retainers.jfr"
MAX_DUMP = 64 * 2**20  # the old-object sampler keeps 256 samples: a dump is some 100 KiB
MAX_HOLDS = 20
TRIES = 3  # a recording that failed (a jcmd or `jfr print` timeout on a loaded host) is tried again


@dataclass(slots=True)
class _Recording:
    started: float


class Retainers:
    """The recordings of one `jvm` probe, per process."""

    def __init__(self, root: Path = HOST_ROOT) -> None:
        self.root = root
        self._wanted: set[str] = set()
        self._recordings: dict[tuple[str, int, float], _Recording] = {}
        self._failed: Counter[tuple[str, int, float]] = Counter()
        self._lock = threading.Lock()

    def want(self, instance: str) -> None:
        """A leak finding opened on `instance`: record what holds it on the probe's next run."""
        with self._lock:
            self._wanted.add(instance)

    def forget(self, key: tuple[str, int, float]) -> None:
        with self._lock:
            self._recordings.pop(key, None)  # the process is gone: its recording went with it
            self._failed.pop(key, None)

    def step(self, target: ProbeTarget, now: float, settings: JvmHistograms, result: ProbeResult) -> None:
        """Start a wanted recording, or dump and stop one that has run `record`."""
        key = (target.instance, target.pid, target.start_time)
        with self._lock:
            recording = self._recordings.get(key)
            wanted = target.instance in self._wanted
            self._wanted.discard(target.instance)
        wanted = wanted and settings.retainers.on_leak
        if recording is None and wanted and not same_mount_namespace(target.pid, self.root):
            result.problems.append(
                ProbeError(
                    f"the JVM {target.pid} runs in another mount namespace (a container): medic cannot "
                    "read a JFR dump it writes there, so it names no holder of the leak"
                )
            )
            return
        try:
            if recording is None:
                if wanted:
                    self._start(target, now, settings, key)
            elif now - recording.started >= settings.retainers.record:
                with self._lock:
                    self._recordings.pop(key, None)
                samples = self._dump(target, settings)
                result.snapshots.append(_snapshot(target, now, samples, now - recording.started))
        except TargetGone:
            raise
        except ProbeError as exc:
            with self._lock:
                self._failed[key] += 1
                again = self._failed[key] < TRIES
                if again:
                    self._wanted.add(target.instance)
            tail = f" (medic records again, try {self._failed[key] + 1} of {TRIES})" if again else ""
            result.problems.append(type(exc)(f"recording what holds the leak: {exc}{tail}"))

    def _start(
        self, target: ProbeTarget, now: float, settings: JvmHistograms, key: tuple[str, int, float]
    ) -> None:
        stop_after = int(settings.retainers.record + max(60.0, 2 * settings.timeout))
        run_jcmd(
            target.pid,
            [
                f"JFR.start name={NAME} settings=none +jdk.OldObjectSample#enabled=true disk=false "
                f"duration={stop_after}s"
            ],
            settings,
            self.root,
        )
        with self._lock:
            self._recordings[key] = _Recording(now)

    def _dump(self, target: ProbeTarget, settings: JvmHistograms) -> list[OldObject]:
        samples: list[OldObject] = []

        def read(directory: str, as_target: RunAs, jcmd: Path) -> None:
            samples.extend(_read_dump(os.path.join(directory, DUMP), as_target, jcmd, settings))

        run_jcmd(
            target.pid,
            [
                f"JFR.dump name={NAME} path-to-gc-roots=true filename={{dir}}/{DUMP}",
                f"JFR.stop name={NAME}",
            ],
            settings,
            self.root,
            then=read,
        )
        return samples


def _read_dump(path: str, as_target: RunAs, jcmd: Path, settings: JvmHistograms) -> list[OldObject]:
    """The old-object samples of the dump the JVM wrote at `path`, read by `jfr print` as the JVM's user."""
    try:
        size = os.lstat(path).st_size
    except OSError:
        raise ProbeError(f"the JVM wrote no JFR dump at {path}") from None
    if size > MAX_DUMP:
        raise ProbeError(f"the JFR dump is {size} bytes, more than the old-object sampler writes")
    tool = os.path.join(os.path.dirname(os.path.realpath(jcmd)), "jfr")
    try:
        check_trusted_path(tool)
    except UnsafePath as exc:
        raise ProbeError(f"medic does not run {tool}: {exc}") from None
    try:
        done = subprocess.run(
            [tool, "print", "--events", "jdk.OldObjectSample", path],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=settings.timeout,
            stdin=subprocess.DEVNULL,
            **as_target,
        )
    except subprocess.TimeoutExpired:
        raise ProbeError(f"jfr print did not finish within {settings.timeout:.0f}s") from None
    except OSError as exc:
        raise ProbeError(f"cannot run {tool}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        raise ProbeError(f"jfr print failed (exit {done.returncode}): {done.stderr.strip()[:300]}")
    return parse_old_objects(done.stdout)


def retainer_rows(samples: list[OldObject]) -> list[HistogramRow]:
    """One row per holder: the samples it holds, the container it holds and the classes below it."""
    counts: Counter[str] = Counter()
    whats: dict[str, Counter[str]] = {}
    holds: dict[str, dict[str, None]] = {}
    for sample in samples:
        found = retainer(sample)
        if found is None:
            continue
        counts[found.where] += 1
        whats.setdefault(found.where, Counter())[found.what] += 1
        holds.setdefault(found.where, {}).update(dict.fromkeys(found.holds))
    return [
        HistogramRow(
            where,
            float(count),
            0.0,
            json.dumps({"what": whats[where].most_common(1)[0][0], "holds": list(holds[where])[:MAX_HOLDS]}),
        )
        for where, count in counts.most_common()
    ]


def _snapshot(target: ProbeTarget, now: float, samples: list[OldObject], recorded: float) -> Snapshot:
    rows = retainer_rows(samples)
    return Snapshot(
        target.instance,
        "jfr",
        now,
        rows,
        float(len(samples)),
        0.0,
        target.pid,
        target.start_time,
        len(rows),
        {"samples": len(samples), "held": int(sum(r.count for r in rows)), "recorded_seconds": recorded},
    )
