"""The one exception family of medic.

Every error a user can see says what happened, to what, and what to do. The CLI maps
each class to an exit code in one place (`agent.cli.main`).

    MedicError
    ├── ConfigError            bad or unreadable configuration (exit 2)
    ├── UsageError             bad command-line use (exit 2)
    ├── AgentUnreachable       the CLI cannot reach the agent's API (exit 3)
    ├── ApiError               the agent answered with an error (exit 4)
    ├── StoreError             the state database cannot be opened or written
    ├── SeriesFormatError      a recorded series file (`medic analyze`) is malformed (exit 2)
    ├── UnsafePath             a file, directory or listener another user could control: refused (exit 2)
    └── ProbeError             a probe could not read a figure
        ├── TargetGone         the process vanished (or its pid was reused)
        ├── ProbeAccessDenied  the agent lacks permission to read it
        └── ProbeUnavailable   the figure does not exist here (no cgroup limit, no PSI…)
"""

from __future__ import annotations


class MedicError(Exception):
    """Base of every error medic raises on purpose."""

    exit_code = 1


class ConfigError(MedicError):
    """A configuration file or value is invalid; the message names file, key and expectation."""

    exit_code = 2


class UsageError(MedicError):
    exit_code = 2


class AgentUnreachable(MedicError):
    exit_code = 3


class ApiError(MedicError):
    exit_code = 4


class StoreError(MedicError):
    exit_code = 5


class SeriesFormatError(MedicError):
    """A recorded series file cannot be read; the message names the file, the line and the fix."""

    exit_code = 2


class UnsafePath(MedicError):
    """A path medic would execute, keep state in or read from is controllable by another user."""

    exit_code = 2


class ProbeError(MedicError):
    """A probe failed for one target; the agent records it and carries on."""

    reason = "error"


class TargetGone(ProbeError):
    reason = "gone"


class ProbeAccessDenied(ProbeError):
    reason = "permission"


class ProbeUnavailable(ProbeError):
    reason = "unavailable"
