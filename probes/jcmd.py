"""Running `jcmd` against a target JVM without harming it or trusting it.

jcmd's attach handshake sends SIGQUIT, which kills a process that is not a JVM and makes a JVM with
`-XX:+DisableAttachMechanism` print a thread dump: `attach_refusal` checks first (libjvm.so mapped,
flags in the command line and `JAVA_TOOL_OPTIONS`) and says why not to attach.

medic is often root and the JVM is not: jcmd is run only from a trusted path (root's or medic's, no
group/other write on the way: `find_jcmd`), never from a JDK the target's user can change, and it
runs with the JVM's uid and gid (which attach requires anyway), its command file in a private 0700
directory of that user, within a timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from agent.core.errors import ProbeError, ProbeUnavailable, TargetGone, UnsafePath
from probes.jvmflags import OPTION_VARS
from probes.jvmtext import attach_failure
from probes.linux.fstrust import check_trusted_path, trusted_program
from probes.linux.helpers import RunAs, process_ids, run_as
from probes.linux.maps import read_maps
from probes.linux.procfs import HOST_ROOT, proc_path, read_cmdline, read_environ
from probes.linux.procstatus import read_nspid
from probes.settings import JvmHistograms

JCMD_HOWTO = "install a JDK with jcmd (Debian: openjdk-17-jdk-headless) or set histograms.jvm.jcmd"


def run_jcmd(
    pid: int,
    commands: list[str],
    settings: JvmHistograms,
    root: Path = HOST_ROOT,
    then: Callable[[str, RunAs, Path], None] | None = None,
) -> str:
    """jcmd's answer to `commands` from the JVM `pid`, run as the JVM's user within `settings.timeout`
    (`find_jcmd` says which jcmd); its failures as the probe errors that say what to do. `{dir}` in a
    command is jcmd's private directory (the JVM's user's), where the JVM may write a file that
    `then(directory, run_as, jcmd)` reads once jcmd answered, before the directory is removed."""
    jcmd = find_jcmd(pid, settings.jcmd, root)
    as_target = run_as(process_ids(pid, root), os.geteuid())
    workdir = _command_dir(commands, as_target)
    try:
        try:
            done = subprocess.run(
                [str(jcmd), str(pid), "-f", os.path.join(workdir, "commands")],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=settings.timeout,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
                **as_target,
            )
        except subprocess.TimeoutExpired:
            raise ProbeError(
                f"jcmd did not finish within {settings.timeout:.0f}s on the JVM {pid} (a long GC pause or a "
                "huge heap?); raise histograms.jvm.timeout"
            ) from None
        except OSError as exc:
            raise ProbeUnavailable(f"cannot run {jcmd}: {exc.strerror or exc}; {JCMD_HOWTO}") from None
        if done.returncode != 0 or "Exception" in done.stderr:
            if not os.path.exists(proc_path(root, pid)):
                raise TargetGone(f"the JVM {pid} is gone")
            raise attach_failure(pid, done.returncode, done.stdout, done.stderr)
        if then is not None:
            then(workdir, as_target, jcmd)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # fd-based: safe in a directory the target owned
    return done.stdout


def _command_dir(commands: list[str], as_target: RunAs) -> str:
    """A fresh 0700 directory holding jcmd's command file (0600): owned by the user jcmd runs as,
    so that it can read it and nobody else can."""
    workdir = tempfile.mkdtemp(prefix="medic-jcmd-")
    try:
        fd = os.open(
            os.path.join(workdir, "commands"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
        )
        with os.fdopen(fd, "w") as handle:
            handle.write("\n".join(c.replace("{dir}", workdir) for c in commands) + "\n")
            if as_target:
                os.fchown(handle.fileno(), as_target["user"], as_target["group"])
        if as_target:
            os.chown(workdir, as_target["user"], as_target["group"])
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return workdir


# ------------------------------------------------------------------------------- before attaching
def is_jvm(pid: int, root: Path = HOST_ROOT) -> bool:
    """Whether `pid` maps libjvm.so; raises `TargetGone` / `ProbeAccessDenied`."""
    return any("/libjvm.so" in mapping.path for mapping in read_maps(pid, root))


def attach_refusal(pid: int, root: Path = HOST_ROOT) -> ProbeError | None:
    """Why jcmd must not attach to `pid` (its SIGQUIT would do harm), or None when it may."""
    try:
        if not is_jvm(pid, root):
            return ProbeUnavailable(f"pid {pid} is not a JVM (no libjvm.so mapped): no class histograms")
        argv = read_cmdline(pid, root)
    except ProbeError as exc:
        return exc
    options = [*argv, *_environ_options(pid, root)]
    if "-XX:+DisableAttachMechanism" in options:
        return ProbeUnavailable(
            f"the JVM {pid} runs with -XX:+DisableAttachMechanism: medic does not attach (the attempt would "
            "make it print a thread dump); remove the flag to get class histograms"
        )
    if ("-Xrs" in options or "-XX:+ReduceSignalUsage" in options) and not _attach_socket(pid, root):
        return ProbeUnavailable(
            f"the JVM {pid} runs with -Xrs and its attach socket /tmp/.java_pid* is missing: attaching would "
            "send a SIGQUIT it does not handle (it would exit); restart it to recreate the socket"
        )
    return None


def _environ_options(pid: int, root: Path) -> list[str]:
    try:
        env = read_environ(pid, root)
    except ProbeError:
        return []
    return [word for name in OPTION_VARS for word in env.get(name, "").split()]


def _attach_socket(pid: int, root: Path) -> bool:
    try:
        ns_pid = read_nspid(pid, root)[-1]
    except ProbeError:
        ns_pid = pid
    return os.path.exists(proc_path(root, pid, "root", "tmp", f".java_pid{ns_pid}"))


def find_jcmd(pid: int, configured: str | None = None, root: Path = HOST_ROOT) -> Path:
    """The jcmd to run for `pid`: `configured`, else the one beside the target's own `java`, else the one
    on PATH. Each must be root's or medic's and writable by nobody else (`fstrust.check_trusted_path`):
    a jcmd in a JDK another user can change is refused, never run, since medic may be root."""
    if configured:
        try:
            found = trusted_program(configured)
        except UnsafePath as exc:
            raise ProbeUnavailable(f"histograms.jvm.jcmd {configured} is not safe to run: {exc}") from None
        if found is None:
            raise ProbeUnavailable(
                f"histograms.jvm.jcmd {configured} is not an executable file: {JCMD_HOWTO}"
            )
        return found
    sibling = _sibling_jcmd(pid, root)
    if sibling is not None:
        try:
            return check_trusted_path(sibling)
        except UnsafePath as exc:
            raise ProbeUnavailable(
                f"the JVM {pid} runs from a JDK another user can change ({exc}): medic does not run "
                f"{sibling}; set histograms.jvm.jcmd to a jcmd owned by root (such as /usr/bin/jcmd)"
            ) from None
    try:
        found = trusted_program("jcmd")
    except UnsafePath as exc:
        raise ProbeUnavailable(f"the jcmd on PATH is not safe to run: {exc}; {JCMD_HOWTO}") from None
    if found is None:
        raise ProbeUnavailable(f"no jcmd found for the JVM {pid}: {JCMD_HOWTO}")
    return found


def _sibling_jcmd(pid: int, root: Path) -> str | None:
    """The jcmd beside the target's `java` (same version), when the target shares medic's mount namespace
    (a path read from a container's exe names a file of the container, not of the host)."""
    if not same_mount_namespace(pid, root):
        return None
    try:
        sibling = os.path.join(os.path.dirname(os.readlink(proc_path(root, pid, "exe"))), "jcmd")
    except OSError:
        return None
    return sibling if os.path.lexists(sibling) else None


def same_mount_namespace(pid: int, root: Path = HOST_ROOT) -> bool:
    """Whether `pid` sees the file system medic sees (a path it reads or writes names the same file)."""
    try:
        return os.readlink(proc_path(root, pid, "ns", "mnt")) == os.readlink(
            proc_path(root, "self", "ns", "mnt")
        )
    except OSError:
        return False
