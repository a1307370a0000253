"""What a Python target lacks when its in-process hook does not answer, seen from outside.

A target of medic's own environment starts the hook through the `.pth` line of `medic hook
install-pth`; a target of another image or virtualenv through the copy that `medic hook install DIR
--python` puts in `DIR/python`, which it finds on its `PYTHONPATH` (its `sitecustomize` starts the
hook). Either way the hook starts only when `MEDIC_HOOK_SOCKET` is set, and binds the socket that
variable names. `python_hook_gaps` reads the target's command line and environment (/proc/PID) and
looks for the hook's files as the target sees them (through /proc/PID/root), and says each thing
that is missing, in the order a person would fix them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.core.errors import ProbeError
from medic_hook.errors import SocketPathError
from medic_hook.paths import ENV_SOCKET, expand
from probes.linux.procfs import HOST_ROOT, proc_path, read_cmdline, read_environ
from probes.linux.procstatus import read_status

INSTALL = "`medic hook install DIR --python` (an init container, into a volume the target mounts)"
_OPTIONS_WITH_ARGUMENT = frozenset({"-W", "-X", "--check-hash-based-pycs"})
_FLAG_GAPS = {
    "I": "it runs with -I (isolated mode), which ignores PYTHONPATH, where a target of another image finds "
    "the hook: drop -I, or start the hook in the program (`import medic_hook; medic_hook.start()`)",
    "E": "it runs with -E, which ignores PYTHONPATH, where a target of another image finds the hook: drop "
    "-E, or start the hook in the program (`import medic_hook; medic_hook.start()`)",
    "S": "it runs with -S, so Python imports no sitecustomize and runs no .pth line: drop -S, or start "
    "the hook in the program (`import medic_hook; medic_hook.start()`)",
}


def interpreter_flags(argv: Sequence[str]) -> set[str]:
    """The one-letter options given to the Python interpreter (`-I`, `-sE`), before the program."""
    flags: set[str] = set()
    args = iter(argv[1:])
    for arg in args:
        if arg in _OPTIONS_WITH_ARGUMENT:
            next(args, None)
            continue
        if arg.startswith("--"):
            continue
        if not arg.startswith("-") or arg == "-":
            break
        for letter in arg[1:]:
            if letter in "cm":  # -c CMD, -m MODULE: the program starts here
                return flags
            if letter in "WX":  # -Wdefault, -Xdev: the rest of the word is the option's argument
                break
            flags.add(letter)
    return flags


def python_hook_gaps(pid: int, socket: str | None = None, root: Path = HOST_ROOT) -> list[str]:
    """What keeps the in-process hook of Python process `pid` from answering; empty when nothing
    visible from outside is missing. `socket`: where medic looks for it (`hook.socket`), if set."""
    try:
        env = read_environ(pid, root)
        argv = read_cmdline(pid, root)
    except ProbeError as exc:
        return [f"cannot read its environment or command line ({exc}): run medic as its user or root"]
    gaps = [gap for flag, gap in _FLAG_GAPS.items() if flag in interpreter_flags(argv)]
    if not env.get(ENV_SOCKET):
        gaps.append(
            f"MEDIC_HOOK_SOCKET is not in its environment, and the hook starts only when it is set: "
            f"set MEDIC_HOOK_SOCKET={socket or 'auto'}"
        )
    gaps += _pythonpath_gaps(env, proc_path(root, pid, "root"))
    if not gaps:
        gaps += _socket_gaps(pid, env, socket, root)
    return gaps


def _pythonpath_gaps(env: Mapping[str, str], target_root: str) -> list[str]:
    entries = [entry for entry in env.get("PYTHONPATH", "").split(":") if entry]
    if not entries:
        return [
            f"PYTHONPATH is not set: a Python of another image or virtualenv finds the hook only through "
            f"it; install the hook with {INSTALL} and set PYTHONPATH=DIR/python (in medic's own "
            "environment, `medic hook install-pth` writes a .pth line that starts medic_hook instead)"
        ]
    first_customize = next((e for e in entries if _exists(target_root, e, "sitecustomize.py")), None)
    hooked = next((e for e in entries if _exists(target_root, e, "medic_hook/__init__.py")), None)
    if hooked is None:
        return [
            f"PYTHONPATH={env['PYTHONPATH']} names no directory holding medic's hook as the target sees "
            f"it (medic_hook/ and sitecustomize.py): install it there with {INSTALL}, "
            "and mount that volume in the target's container"
        ]
    if not _exists(target_root, hooked, "sitecustomize.py"):
        return [
            f"{hooked} on its PYTHONPATH holds medic_hook/ but no sitecustomize.py to start it: install the hook "
            f"with {INSTALL}; or, in the target's own environment, `medic hook install-pth` (a .pth line that "
            "starts medic_hook), or `medic_hook.start()` in the program"
        ]
    if first_customize != hooked:
        return [
            f"{first_customize} comes first on PYTHONPATH with its own sitecustomize.py, which hides "
            f"medic's in {hooked}: put {hooked} first"
        ]
    return []


def _exists(target_root: str, directory: str, name: str) -> bool:
    if not directory.startswith("/"):
        return False  # relative to the target's working directory: not judged
    return os.path.isfile(target_root + os.path.join(directory, name))


def _socket_gaps(pid: int, env: Mapping[str, str], socket: str | None, root: Path) -> list[str]:
    """The socket the target binds against the one medic looks for."""
    bound = None
    with contextlib.suppress(ProbeError, SocketPathError):
        status = read_status(pid, root)
        ns_pid = status.ns_pids[-1] if status.ns_pids else pid
        if status.effective_uid is not None:
            bound = expand(env[ENV_SOCKET], ns_pid, status.effective_uid, env)
    if bound and socket and os.path.normpath(bound) != os.path.normpath(socket):
        return [
            f"it binds {bound} (its MEDIC_HOOK_SOCKET) but medic looks for {socket} (hook.socket): give both "
            "the same path, in a directory both containers mount"
        ]
    return [
        f"everything it needs is there but its hook did not start or answer{f' at {bound}' if bound else ''}: "
        "restart it with MEDIC_HOOK_DEBUG=1 to see why on its stderr (for example a hook directory "
        "that others can write to, which the hook refuses)"
    ]
