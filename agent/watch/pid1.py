"""medic as PID 1 of a container: a minimal init in front of the agent.

PID 1 inherits every orphan of its pid namespace and must reap them, or they stay zombies until
the container ends. The agent cannot do it itself: a `waitpid(-1)` in the agent would also take
the exit status of the children it waits for on purpose (managed commands, `exec` actuators,
jcmd), and a failing restart command would read as a success. So, as PID 1, medic forks: the child
runs the agent, the parent stays behind as init, as tini does:

- it reaps every child that ends (orphans included), and ends with the agent's exit status
  (128 + N when the agent was killed by signal N);
- it forwards TERM, INT, HUP, QUIT, USR1 and USR2 to the agent (PID 1 gets no default
  signal action, so without this `docker stop` would wait for its timeout and then KILL);
- the agent runs in its own process group, made the terminal's foreground group when there is
  a terminal, so a Ctrl-C reaches it once.

A container that already has an init (`docker run --init`, tini) never gets here: medic is not PID 1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def become_init_if_pid1() -> None:
    """Return in the process that runs the agent; as PID 1 that is a forked child, and this
    process stays as the init that reaps orphans (it never returns)."""
    if os.getpid() != 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    agent = os.fork()
    if agent == 0:
        _into_own_group()
        return
    os._exit(serve(agent))


def serve(agent: int) -> int:
    """Reap every child until the agent ends; forward signals to it; return its exit status."""

    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent, sig)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    while True:
        try:
            pid, status = os.wait()  # retried after a forwarded signal (PEP 475)
        except ChildProcessError:
            return 0
        if pid == agent:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def _into_own_group() -> None:
    os.setpgid(0, 0)
    if not os.isatty(0):
        return
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may not take the tty
    try:
        os.tcsetpgrp(0, os.getpid())
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, previous)
