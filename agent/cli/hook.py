"""`medic hook`: the allocator hooks on the target side.

medic hook path                       the LD_PRELOAD shim's path, for native targets
medic hook install DIR [--allocator jemalloc] [--python]   copy the shim (and allocator) into DIR, e.g.
                                      a volume shared with a target container, and with --python the
                                      stdlib-only Python hook into DIR/python; prints the target's
                                      LD_PRELOAD (native) and PYTHONPATH (Python)
medic hook env [--python] [--allocator jemalloc]   the environment a target needs
medic hook install-pth [--dir DIR]    autostart the in-process hook (`medic_hook`) in every Python of
                                      this environment (only acts when MEDIC_HOOK_SOCKET is set)
medic hook call OP (--pid PID | --socket PATH [--pid PID]) [KEY=VALUE ...]   send one request, print
                                      the reply; with --pid only that process's own hook is trusted
medic hook clean                      remove sockets of processes that are gone

Every action but `call` (whose reply is JSON already) prints JSON with --json.

Hook replies and paths come from the target: everything is printed through `echo`, so a control
character in them shows escaped instead of driving the terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from typing import Any

from agent.core.errors import UsageError
from agent.core.text import echo

HELP = "LD_PRELOAD shim path, target environment, and direct calls to a target's allocator hook"
PTH_NAME = "medic-hook.pth"
# Python runs `import` lines of .pth files at start-up, before the program. This one reads the variable
# first, so a process without it imports nothing of ours; with it, only `medic_hook` (never `agent`,
# `native_hooks`, ...) is imported, and any failure is swallowed so the target always starts.
# MEDIC_HOOK_DEBUG=1 shows on stderr why a hook did not start.
PTH_LINE = (
    "import os; os.environ.get('MEDIC_HOOK_SOCKET') and exec("
    "'try:\\n import medic_hook\\nexcept Exception:\\n pass\\nelse:\\n medic_hook.autostart()')\n"
)


class _IntermixedParser(argparse.ArgumentParser):
    """A parser that takes its options and its KEY=VALUE positionals in any order: plain argparse stops
    filling `nargs="*"` at the first option, so `call stats --pid 1 detail=true` was refused."""

    _inner = False

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        if self._inner:  # parse_known_intermixed_args calls back into this method
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="hook_command", metavar="ACTION", required=True)
    sub.add_parser("path", help="print the path of the built LD_PRELOAD shim")
    install = sub.add_parser(
        "install", help="copy the shim (and an allocator) into DIR for another container"
    )
    install.add_argument("dir", help="directory the target can read, e.g. a shared volume")
    install.add_argument("--allocator", choices=["glibc", "jemalloc", "tcmalloc"], default="glibc")
    install.add_argument(
        "--python",
        action="store_true",
        help="also the in-process hook for Python targets of another image or virtualenv (PYTHONPATH=DIR/python)",
    )
    env = sub.add_parser("env", help="print the environment variables a target needs for a hook")
    env.add_argument("--python", action="store_true", help="a Python target (in-process hook, no shim)")
    env.add_argument("--allocator", choices=["glibc", "jemalloc", "tcmalloc"], default="glibc")
    env.add_argument("--socket", default="auto", help="MEDIC_HOOK_SOCKET value (default: auto)")
    pth = sub.add_parser("install-pth", help=f"write {PTH_NAME} so Python targets autostart the hook")
    pth.add_argument("--dir", help="site-packages directory (default: this interpreter's purelib)")
    call = sub.add_parser("call", help="send one request to a hook and print the JSON reply")
    call.__class__ = _IntermixedParser  # options and KEY=VALUE in any order
    call.add_argument(
        "op", help="ping, stats, purge, prof_dump, prof_active, histogram, sites_start, sites or sites_stop"
    )
    call.add_argument(
        "params", nargs="*", metavar="KEY=VALUE", help="request fields; VALUE is JSON or a string"
    )
    call.add_argument(
        "--pid",
        type=int,
        help="the target: its socket is found by convention, and only its own hook is trusted",
    )
    call.add_argument(
        "--socket",
        help="the hook socket path (without --pid, its server must run as root, medic's user or the file's owner)",
    )
    call.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the reply (default 5)")
    sub.add_parser("clean", help="remove hook sockets of processes that are gone")


def run(args: argparse.Namespace) -> int:
    return {
        "path": _path,
        "install": _install,
        "env": _env,
        "install-pth": _install_pth,
        "call": _call,
        "clean": _clean,
    }[args.hook_command](args)


def _path(args: argparse.Namespace) -> int:
    from native_hooks.shim import shim_path

    path = shim_path()
    echo(json.dumps({"path": path}) if args.json else path)
    return 0


def _install(args: argparse.Namespace) -> int:
    installed = install_hook(args.dir, args.allocator)
    if args.python:
        installed["pythonpath"] = install_python_hook(args.dir)
    if args.json:
        echo(json.dumps(installed))
        return 0
    echo(f"LD_PRELOAD={':'.join(installed['preload'])}")
    if args.python:
        allocator = [p for p in installed["preload"] if not p.endswith(INSTALLED_SHIM)]
        echo(
            f"# a Python target instead: PYTHONPATH={installed['pythonpath']}"
            + (f" LD_PRELOAD={':'.join(allocator)}" if allocator else "")
            + " (the shim and the in-process hook would both claim MEDIC_HOOK_SOCKET)"
        )
    return 0


LIBRARY_DIRS = ("/usr/lib/{arch}", "/lib/{arch}", "/usr/local/lib", "/usr/lib", "/lib")
INSTALLED_SHIM = "libmedic_shim.so"


def find_library(soname: str) -> str:
    """The path of a system library by its soname (`libjemalloc.so.2`); `UsageError` naming the package."""
    import sysconfig

    arch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    for directory in LIBRARY_DIRS:
        path = os.path.join(directory.format(arch=arch), soname)
        if os.path.isfile(path):
            return os.path.realpath(path)
    raise UsageError(
        f"{soname} is not installed here: install it (Debian: apt-get install libjemalloc2 or "
        "libgoogle-perftools4) or give the target its own copy"
    )


def install_hook(directory: str, allocator: str = "glibc") -> dict[str, Any]:
    """Copy the shim (and the allocator library, if any) into `directory` for a target in another
    container or mount namespace; returns the files and the target's LD_PRELOAD list.

    Each file is written beside its final name and renamed into place, so a target that starts
    meanwhile loads the old copy or the new one, never half a file. Mode 0755: the target may run
    as another user.
    """
    import shutil
    import tempfile

    from native_hooks.preloads import PRELOADS
    from native_hooks.shim import shim_path

    preload = PRELOADS.get(allocator)
    sources = [(find_library(preload), preload)] if preload else []
    sources.append((shim_path(), INSTALLED_SHIM))
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        installed = []
        for source, name in sources:
            fd, staging = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
            try:
                with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
                    shutil.copyfileobj(src, out)
                os.chmod(staging, 0o755)
                os.replace(staging, os.path.join(directory, name))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(staging)
                raise
            installed.append(os.path.join(os.path.abspath(directory), name))
    except OSError as exc:
        raise UsageError(
            f"cannot install the hook into {directory}: {exc.strerror or exc}; "
            "give a writable directory (e.g. a volume shared with the target)"
        ) from None
    return {"dir": os.path.abspath(directory), "preload": installed}


PYTHON_DIR = "python"  # DIR/python: what a Python target of another image puts on PYTHONPATH


def install_python_hook(directory: str) -> str:
    """Copy the stdlib-only `medic_hook` package and its `sitecustomize` autostart into
    `directory/python`, for a Python target that has no medic installed; returns that path.

    The copy is made beside it and swapped in by renames, so a target that starts meanwhile finds
    the old copy, the new one or none, never a mix. Directories 0755 and files 0644, whatever the
    umask: the target may run as another user, and nobody but the installer may change them (the
    autostart refuses code that others could have changed).
    """
    import secrets
    import shutil
    import tempfile

    import medic_hook

    source = os.path.dirname(os.path.abspath(medic_hook.__file__))
    final = os.path.join(os.path.abspath(directory), PYTHON_DIR)
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".python.", dir=directory)
        try:
            package = os.path.join(staging, "medic_hook")
            os.mkdir(package)
            for name in sorted(os.listdir(source)):
                if name.endswith(".py") and name != "sitecustomize.py":
                    _copy_file(os.path.join(source, name), os.path.join(package, name))
            _copy_file(os.path.join(source, "sitecustomize.py"), os.path.join(staging, "sitecustomize.py"))
            for path in (package, staging):
                os.chmod(path, 0o755)
            old = None
            if os.path.lexists(final):
                old = os.path.join(directory, f".python-old.{secrets.token_hex(6)}")
                os.rename(final, old)  # a planted symlink is moved aside, never followed
            os.rename(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if old is not None:
            if os.path.islink(old) or not os.path.isdir(old):
                os.unlink(old)
            else:
                shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise UsageError(
            f"cannot install the Python hook into {directory}: {exc.strerror or exc}; "
            "give a writable directory (e.g. a volume shared with the target)"
        ) from None
    return final


def _copy_file(source: str, target: str) -> None:
    """A new file (never written through a symlink), 0644 whatever the umask."""
    from probes.linux.fstrust import atomic_write

    with open(source, "rb") as src:
        atomic_write(target, src.read(), mode=0o644, fsync=False)
    os.chmod(target, 0o644)


def target_environment(python: bool, allocator: str, socket: str) -> dict[str, str]:
    """The variables that give a target a hook (and heap profiles where the allocator has them)."""
    from native_hooks.preloads import PRELOADS

    env: dict[str, str] = {}
    preload = [PRELOADS[allocator]] if PRELOADS.get(allocator) else []
    if not python:
        from native_hooks.shim import shim_path

        preload.append(shim_path())
    if preload:
        env["LD_PRELOAD"] = ":".join(p for p in preload if p)
    env["MEDIC_HOOK_SOCKET"] = socket
    if allocator == "jemalloc":
        env["MALLOC_CONF"] = "prof:true,prof_active:false"
    return env


def _env(args: argparse.Namespace) -> int:
    env = target_environment(args.python, args.allocator, args.socket)
    if args.json:
        echo(json.dumps(env))
        return 0
    for key, value in env.items():
        echo(f"{key}={value}")
    if args.python:
        echo(
            f"# and once per Python environment: medic hook install-pth (writes {PTH_NAME}); for a target of "
            f"another image or virtualenv: medic hook install DIR --python, then PYTHONPATH=DIR/{PYTHON_DIR}"
        )
    return 0


def _install_pth(args: argparse.Namespace) -> int:
    import sysconfig

    from probes.linux.fstrust import atomic_write

    directory = args.dir or sysconfig.get_paths()["purelib"]
    if not os.path.isdir(directory):
        raise UsageError(f"{directory} is not a directory: give the site-packages directory with --dir")
    target = os.path.join(directory, PTH_NAME)
    try:
        # every user of the environment reads it; a planted symlink is replaced, never written through
        atomic_write(target, PTH_LINE.encode(), mode=0o644)
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror}; run as the environment's owner") from None
    if args.json:
        echo(json.dumps({"path": target}))
        return 0
    echo(
        f"wrote {target}: Python processes of this environment start the hook (medic_hook) "
        "when MEDIC_HOOK_SOCKET is set"
    )
    return 0


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` arguments as request fields; VALUE is read as JSON when it parses, else as a string."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"expected KEY=VALUE, got {pair!r} (e.g. path=/tmp/x.heap or top=20)")
        try:
            params[key] = json.loads(raw)
        except ValueError:
            params[key] = raw
    return params


def _call(args: argparse.Namespace) -> int:
    from native_hooks.client import HookClient
    from native_hooks.errors import HookNotFound
    from native_hooks.sockets import find_socket

    if args.pid is None and args.socket is None:
        raise UsageError("say which hook: --pid PID (found by convention) or --socket PATH")
    params = parse_params(args.params)
    path = args.socket or find_socket(args.pid)
    if path is None:
        from native_hooks.errors import HOOK_HOWTO

        raise HookNotFound(f"no hook socket found for pid {args.pid}: {HOOK_HOWTO}")
    with HookClient(path, args.timeout, pid=args.pid) as client:  # pid None: the server's uid is checked
        reply = client.request(args.op, **params)
    echo(json.dumps(reply, indent=2))
    return 0


def _clean(args: argparse.Namespace) -> int:
    from native_hooks.sockets import remove_stale_sockets

    removed = remove_stale_sockets()
    if args.json:
        echo(json.dumps({"removed": removed}))
    else:
        echo("\n".join(f"removed {path}" for path in removed) or "no stale hook sockets")
    return 0
