"""Real headless Chromium for the tests that read what the dashboard shows: run it to completion in
its own process group (killed on timeout), dump the rendered DOM, and query it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from support.procs import reap

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium is not installed")


def chromium_argv(profile: Path, *extra: str) -> list[str]:
    return [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *extra,
    ]


def run_chromium(argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run Chromium to completion in its own process group; the whole group is killed on timeout."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        reap(proc)
        raise AssertionError(f"chromium did not finish within {timeout}s") from None
    finally:
        if proc.poll() is None:
            reap(proc)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # helpers (zygote, crashpad) left behind
    except ProcessLookupError:
        pass
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def dump_dom(url: str, profile: Path, budget_ms: int = 4000) -> str:
    done = run_chromium(chromium_argv(profile, f"--virtual-time-budget={budget_ms}", "--dump-dom", url))
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode()


class Dom(HTMLParser):
    """The rendered DOM as a flat list of (tag, attributes, text inside) for simple queries."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[dict] = []
        self._open: list[dict] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        parent = self._open[-1]["index"] if self._open else None
        element = {
            "tag": tag,
            "attrs": {k: v or "" for k, v in attrs},
            "text": "",
            "index": len(self.elements),
        }
        element["parent"] = parent
        self.elements.append(element)
        if tag not in ("img", "br", "meta", "link", "input", "hr", "circle", "line", "rect", "polyline"):
            self._open.append(element)

    def _descends(self, element: dict, ancestor: dict) -> bool:
        parent = element["parent"]
        while parent is not None:
            if parent == ancestor["index"]:
                return True
            parent = self.elements[parent]["parent"]
        return False

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i]["tag"] == tag:
                del self._open[i:]
                break

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element["text"] += data

    def find(
        self, tag: str | None = None, cls: str | None = None, within: dict | None = None, **attrs: str
    ) -> list[dict]:
        return [
            e
            for e in self.elements
            if (tag is None or e["tag"] == tag)
            and (within is None or self._descends(e, within))
            and (cls is None or cls in e["attrs"].get("class", "").split())
            and all(e["attrs"].get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]
