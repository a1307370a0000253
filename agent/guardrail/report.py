"""What a run shows: the terminal table, the self-contained HTML report (inline SVG curves of both
builds' memory and latency, no external resource of any kind) and JUnit XML (one test case per
verdict, a regression as a failure), so that any CI system shows the result.

Every text that came from outside (server output, error messages) is escaped for its target:
`printable` for the terminal, `html.escape` for HTML, `xml.sax.saxutils` for XML.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from xml.sax.saxutils import escape as xml_escape
from xml.sax.saxutils import quoteattr

from agent.core.text import printable, render
from agent.core.units import format_bytes
from agent.guardrail.run import Result

COLOURS = {"baseline": "#1f77b4", "candidate": "#d62728"}
MAX_SVG_POINTS = 600


def table(result: Result) -> str:
    rows = []
    for v in result.verdicts:
        confidence = "-" if v.confidence is None else f"{v.confidence:.2f}"
        rows.append([v.name, v.status.upper() if v.failed else v.status, confidence, v.summary])
    lines = [render(["verdict", "result", "confidence", "evidence"], rows)]
    builds = []
    for b in result.builds():
        lat = b["latency_seconds"]
        builds.append(
            [
                b["name"],
                lat["requests"],
                lat["errors"],
                _ms(lat["p50"]),
                _ms(lat["p90"]),
                _ms(lat["p99"]),
                format_bytes(b["rss_first_bytes"]),
                format_bytes(b["rss_last_bytes"]),
                b["allocator"] if b["allocator"] in ("present", "absent") else "absent",
            ]
        )
    lines.append("")
    lines.append(
        render(
            ["build", "requests", "errors", "p50", "p90", "p99", "rss first", "rss last", "allocator"],
            builds,
            numeric={1, 2, 3, 4, 5, 6, 7},
        )
    )
    lines.extend(f"note: {printable(n)}" for n in result.notes)
    verdict = (
        f"REGRESSION: {', '.join(v.name for v in result.regressions)}"
        if result.regressions
        else "no regression"
    )
    lines.append(f"\nguardrail: {verdict} ({result.elapsed:.0f}s)")
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return "-" if seconds is None or not math.isfinite(seconds) else f"{seconds * 1000:.2f}ms"


def _polyline(
    points: list[tuple[float, float]],
    x0: float,
    x1: float,
    y0: float,
    y1: float,
    box: tuple[int, int, int, int],
) -> str:
    left, top, width, height = box
    if len(points) > MAX_SVG_POINTS:
        step = len(points) / MAX_SVG_POINTS
        points = [points[int(i * step)] for i in range(MAX_SVG_POINTS)]
    sx = width / (x1 - x0) if x1 > x0 else 0.0
    sy = height / (y1 - y0) if y1 > y0 else 0.0
    return " ".join(f"{left + (x - x0) * sx:.1f},{top + height - (y - y0) * sy:.1f}" for x, y in points)


def svg_chart(title: str, series: dict[str, list[tuple[float, float]]], unit: str) -> str:
    """One chart: a line per build, axes labelled at both ends (inline SVG)."""
    width, height, margin = 720, 240, 60
    box = (margin, 20, width - margin - 10, height - 60)
    pts = [p for s in series.values() for p in s if math.isfinite(p[1])]
    if not pts:
        return f"<p>{html.escape(title)}: no data</p>"
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if y1 == y0:
        y1 = y0 + 1
    label = format_bytes if unit == "bytes" else (lambda v: f"{v * 1000:.2f} ms")
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{html.escape(title)}">',
        f'<text x="{margin}" y="14" font-size="13">{html.escape(title)}</text>',
        f'<rect x="{box[0]}" y="{box[1]}" width="{box[2]}" height="{box[3]}" fill="none" stroke="#999"/>',
        f'<text x="4" y="{box[1] + 10}" font-size="11">{html.escape(label(y1))}</text>',
        f'<text x="4" y="{box[1] + box[3]}" font-size="11">{html.escape(label(y0))}</text>',
        f'<text x="{box[0]}" y="{height - 24}" font-size="11">{x0:.0f}s</text>',
        f'<text x="{box[0] + box[2] - 30}" y="{height - 24}" font-size="11">{x1:.0f}s</text>',
    ]
    for i, (name, points) in enumerate(series.items()):
        colour = COLOURS.get(name, "#555")
        clean = [p for p in points if math.isfinite(p[1])]
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
            f'points="{_polyline(clean, x0, x1, y0, y1, box)}"/>'
        )
        parts.append(
            f'<text x="{box[0] + 10 + 120 * i}" y="{height - 6}" font-size="12" fill="{colour}">{html.escape(name)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _rolling_p50(points: list[tuple[float, float]], window: int = 25) -> list[tuple[float, float]]:
    out = []
    for i in range(0, len(points), max(1, window // 5)):
        chunk = sorted(v for _, v in points[max(0, i - window) : i + 1])
        out.append((points[i][0], chunk[len(chunk) // 2]))
    return out


def html_report(result: Result) -> str:
    doc = result.to_dict()
    m = result.measurement
    memory: dict[str, list[tuple[float, float]]] = {}
    allocated: dict[str, list[tuple[float, float]]] = {}
    for build in m.builds:
        memory[build.name] = [(t - m.start, v) for t, v in build.points("rss_bytes")]
        if build.points("allocator_allocated_bytes"):
            allocated[build.name] = [(t - m.start, v) for t, v in build.points("allocator_allocated_bytes")]
    latency = {
        name: _rolling_p50([(t, v) for t, v, ok in doc["latency_series"][name] if ok])
        for name in ("baseline", "candidate")
    }
    rows = "\n".join(
        f"<tr class={quoteattr(v.status)}><td>{html.escape(v.name)}</td><td>{html.escape(v.status)}</td>"
        f"<td>{'-' if v.confidence is None else f'{v.confidence:.2f}'}</td><td>{html.escape(v.summary)}</td></tr>"
        for v in result.verdicts
    )
    builds = "\n".join(
        f"<tr><td>{html.escape(b['name'])}</td><td>{b['latency_seconds']['requests']}</td>"
        f"<td>{b['latency_seconds']['errors']}</td><td>{_ms(b['latency_seconds']['p50'])}</td>"
        f"<td>{_ms(b['latency_seconds']['p99'])}</td><td>{html.escape(format_bytes(b['rss_peak_bytes']))}</td></tr>"
        for b in doc["builds"]
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in result.notes)
    headline = (
        f"Regression: {html.escape(', '.join(doc['regressions']))}" if result.regressions else "No regression"
    )
    charts = [svg_chart("RSS", memory, "bytes")]
    if allocated:
        charts.append(svg_chart("allocated bytes (allocator)", allocated, "bytes"))
    charts.append(svg_chart("latency, rolling median of 25 requests", latency, "seconds"))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>medic guardrail: {headline}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
tr.fail td {{ background: #fdd; }} tr.unknown td {{ background: #eee; }}
</style></head><body>
<h1>medic guardrail: {headline}</h1>
<p>{html.escape(" ".join(result.options.baseline.argv) or str(result.options.baseline.url))} (baseline) against
{html.escape(" ".join(result.options.candidate.argv) or str(result.options.candidate.url))} (candidate);
{result.options.duration:g}s in {result.options.rounds} ABBA rounds after {result.options.warmup:g}s of warm-up.</p>
<table><tr><th>verdict</th><th>result</th><th>confidence</th><th>evidence</th></tr>
{rows}
</table>
<table><tr><th>build</th><th>requests</th><th>errors</th><th>p50</th><th>p99</th><th>peak RSS</th></tr>
{builds}
</table>
{"".join(charts)}
<ul>{notes}</ul>
</body></html>
"""


def junit_xml(result: Result) -> str:
    cases = []
    for v in result.verdicts:
        name = quoteattr(v.name)
        body = ""
        if v.failed:
            body = (
                f'<failure message={quoteattr(v.summary)} type="regression">{xml_escape(v.summary)}</failure>'
            )
        elif v.status == "unknown":
            body = f"<skipped message={quoteattr(v.summary)}/>"
        else:
            body = f"<system-out>{xml_escape(v.summary)}</system-out>"
        cases.append(f'  <testcase classname="medic.guardrail" name={name} time="0">{body}</testcase>')
    failures = len(result.regressions)
    skipped = sum(1 for v in result.verdicts if v.status == "unknown")
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name="medic guardrail" tests="{len(result.verdicts)}" failures="{failures}" '
        f'errors="0" skipped="{skipped}" time="{result.elapsed:.1f}">\n'
        + "\n".join(cases)
        + "\n</testsuite>\n"
    )


def junit_server_failure(name: str, message: str) -> str:
    """JUnit XML for a run that could not judge: one error case naming the server that failed."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<testsuite name="medic guardrail" tests="1" failures="0" errors="1" skipped="0">\n'
        f'  <testcase classname="medic.guardrail" name={quoteattr(f"{name} server")}>'
        f'<error message={quoteattr(message.splitlines()[0])} type="server-failed">{xml_escape(message)}</error>'
        "</testcase>\n</testsuite>\n"
    )


def write_private(path: str, text: str) -> None:
    """Write a report file 0600 (it holds command lines and server output)."""
    import os

    target = Path(path)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(target, 0o600)
