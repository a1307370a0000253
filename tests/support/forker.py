"""A server that forks workers, for the process-tree tests: `python -m support.forker --children N TAG`.

Forks N children that keep the parent's command line (as gunicorn's workers do) and sleep until
killed; a child that exits is not replaced. Prints `ready PARENT_PID CHILD_PID...` (the first 64
children) once all are forked. `TAG` is free text to make the command line unique to one test.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=2)
    parser.add_argument("tag", nargs="?", default="")
    args = parser.parse_args(argv)
    children = []
    for _ in range(args.children):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            while True:
                signal.pause()
        children.append(pid)
    print("ready", os.getpid(), *children[:64], flush=True)
    signal.signal(signal.SIGCHLD, lambda *_: _reap())
    while True:
        signal.pause()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


if __name__ == "__main__":
    sys.exit(main())
