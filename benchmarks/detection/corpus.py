"""The benchmark corpus: traces recorded from real programs plus the generated long traces.

Recorded traces live in `corpus/*.jsonl.gz` (written by `record.py`) and are labelled in
`corpus/labels.json`. A recording lasts tens of seconds; its time axis is stretched by the
label's `time_scale` (300: one real second is five production minutes, so a 0.2 s sample
period becomes one minute and a 75 s recording spans 6 h 15 min) before it is judged with the
production defaults. It begins at the label's `start_s`, once the program has loaded (an agent
attaching to a running process); the leak onset and the memory limit are part of each label.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from benchmarks.detection.generate import T0, Trace, generate

CORPUS = Path(__file__).resolve().parent / "corpus"
LABELS = CORPUS / "labels.json"


def load_recording(path: Path) -> dict[str, list[tuple[float, float]]]:
    """metric -> points of one recorded JSONL(.gz) file (one instance per file)."""
    opener = gzip.open if path.suffix == ".gz" else open
    series: dict[str, list[tuple[float, float]]] = {}
    with opener(path, "rt") as lines:
        for line in lines:
            row = json.loads(line)
            series.setdefault(row["metric"], []).append((float(row["ts"]), float(row["value"])))
    for points in series.values():
        points.sort()
    return series


def recorded_traces(corpus: Path = CORPUS) -> list[Trace]:
    """The recorded traces, stretched to production time and cut at their OOM like the others."""
    labels_path = corpus / "labels.json"
    if not labels_path.exists():
        return []
    traces = []
    for label in json.loads(labels_path.read_text()):
        series = load_recording(corpus / label["file"])
        scale = float(label["time_scale"])
        start = min(points[0][0] for points in series.values() if points) + float(label.get("start_s", 0.0))
        stretched = {
            metric: [(T0 + (ts - start) * scale, v) for ts, v in points if ts >= start]
            for metric, points in series.items()
        }
        rss = stretched.pop("rss_bytes")
        limit = float(label["limit_bytes"])
        oom = next((ts for ts, v in rss if v >= limit), None)
        if oom is not None:
            rss = [(ts, v) for ts, v in rss if ts <= oom]
            stretched = {m: [(ts, v) for ts, v in pts if ts <= oom] for m, pts in stretched.items()}
        onset = (
            T0 + (float(label["onset_s"]) - float(label.get("start_s", 0.0))) * scale
            if label["leak"]
            else None
        )
        traces.append(
            Trace(
                name=f"rec/{label['name']}",
                leak=bool(label["leak"]),
                description=label["description"],
                points=rss,
                limit=limit,
                onset=onset,
                oom=oom,
                extra=stretched,
                time_scale=scale,
            )
        )
    return traces


def all_traces(seeds: int = 3) -> list[Trace]:
    return recorded_traces() + generate(seeds)
