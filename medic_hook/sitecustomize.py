"""The autostart of medic's hook in a Python that has no medic installed: a target in another image
or virtualenv, given the hook through a shared directory and `PYTHONPATH`.

`medic hook install DIR --python` copies this file to `DIR/python/sitecustomize.py` beside a copy
of the `medic_hook` package. Python imports `sitecustomize` from the first `sys.path` entry that has
one, once, at start-up: with `PYTHONPATH=DIR/python` that is this file. It starts the hook when
`MEDIC_HOOK_SOCKET` is set, then runs the environment's own `sitecustomize` (which it would otherwise
hide), so the target starts as it would without it.

Before importing anything from its directory it checks that nobody less privileged than the target
could have put code there: each directory from its own up to `/` is owned by root or the target's
user and not writable by group or others (a root-owned sticky directory such as /tmp may be crossed),
or lies on a read-only mount, as the hook volume is in the target's container. These are the rules
of medic's `probes.linux.fstrust`, restated here because this file runs in the target and imports
the standard library only. Nothing here stops the program: every failure is swallowed, and
`MEDIC_HOOK_DEBUG=1` prints it on stderr.
"""

from __future__ import annotations

import os
import stat
import sys

_ENV_SOCKET = "MEDIC_HOOK_SOCKET"
_ENV_DEBUG = "MEDIC_HOOK_DEBUG"


def _untrusted(directory: str) -> str | None:
    """Why code in `directory` cannot be trusted by this process, or None."""
    owners = (0, os.geteuid())
    path = os.path.realpath(directory)
    final = True
    while True:
        info = os.lstat(path)
        if not os.statvfs(path).f_flag & os.ST_RDONLY:
            if info.st_uid not in owners:
                return f"{path} belongs to uid {info.st_uid}, who could change the code there"
            crossed = not final and info.st_uid == 0 and info.st_mode & stat.S_ISVTX
            if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not crossed:
                return f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o})"
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path, final = parent, False


def _start(here: str) -> None:
    import importlib.util

    package = os.path.join(here, "medic_hook")
    problem = _untrusted(package)
    if problem:
        raise RuntimeError(f"not loaded from {here}: {problem}")
    spec = importlib.util.find_spec("medic_hook")
    if spec is None or spec.origin != os.path.join(package, "__init__.py"):
        found = spec.origin if spec is not None else "none"
        raise RuntimeError(f"the medic_hook found first on sys.path is not the one beside this file: {found}")
    import medic_hook

    medic_hook.start()


def _chain(here: str) -> None:
    """Run the `sitecustomize` this one hides: the next one on `sys.path` after this directory."""
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module  # as if it had been imported first
    spec.loader.exec_module(module)


def _main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get(_ENV_SOCKET):
        try:
            _start(here)
        except Exception as exc:
            if os.environ.get(_ENV_DEBUG):
                print(f"medic hook: not started: {exc}", file=sys.stderr)
    _chain(here)


_main()
