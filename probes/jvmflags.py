"""The ceilings a JVM enforces on its own memory: the Java heap (`MaxHeapSize`, `-Xmx`), direct buffers
(`MaxDirectMemorySize`) and metaspace (`MaxMetaspaceSize`), read as the JVM states them or from the
options it was started with.

`jcmd PID VM.flags` is the JVM's own account: it always prints `MaxHeapSize` (set or ergonomic), and
`MaxDirectMemorySize` / `MaxMetaspaceSize` only when they were set. Unset, direct buffers may take as
much as the heap (`Runtime.maxMemory()`), and metaspace has no ceiling of its own. When jcmd cannot
answer (attach refused, no jcmd, a timeout), the options are read from what the process started with:
`JAVA_TOOL_OPTIONS` (read by every JVM), then for the `java` launcher `JDK_JAVA_OPTIONS` and the
command line up to the main class, then `_JAVA_OPTIONS`; the last setting wins, as in the JVM.
`-XX:MaxRAMPercentage` (or `MaxRAMFraction`) is a share of the memory the JVM sees: `-XX:MaxRAM` when
set, else the cgroup limit, else the host's RAM. Argument files (`@file`, `-XX:Flags=`,
`-XX:VMOptionsFile=`) are not read: they are files the target's user controls.

Both parsers take untrusted text: bounded, and a figure wider than 64 bits is no figure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.core.figures import FIGURE_LIMIT, decimal

MAX_TEXT = 64 * 1024  # a VM.flags answer is about 1.5 KiB; more is not jcmd's
MAX_WORDS = 4096  # options read from a command line and the environment, at most
OPTION_VARS = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")
_SIZE = re.compile(r"([0-9]{1,20})([kKmMgGtT]?)")
_PERCENT = re.compile(r"[0-9]{1,3}(\.[0-9]{1,6})?")
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_FLAG = re.compile(r"-XX:([A-Za-z][A-Za-z0-9_]{0,80})=(\S{1,64})")
# launcher options whose value is the next word (the word after them is not the main class)
_WITH_VALUE = frozenset(
    {
        "-cp",
        "-classpath",
        "--class-path",
        "-p",
        "--module-path",
        "--upgrade-module-path",
        "--add-modules",
        "--limit-modules",
        "--add-reads",
        "--add-exports",
        "--add-opens",
        "--patch-module",
        "--enable-native-access",
        "--source",
    }
)
_MAIN_NEXT = frozenset({"-jar", "-m", "--module", "-d", "--describe-module"})  # the next word ends options


@dataclass(frozen=True, slots=True)
class JvmLimits:
    """What one JVM's own ceilings are (None: no ceiling of its own, or not known) and where they
    were read (`source`: `VM.flags` or `command line`; `detail`: the flags, as a person reads them)."""

    heap: int | None
    direct: int | None
    metaspace: int | None
    source: str
    detail: str
    direct_set: bool = False  # MaxDirectMemorySize was given (else direct buffers may take the heap's)


def parse_size(text: str) -> int | None:
    """A HotSpot size (`384m`, `2G`, `402653184`), or None when it is not one or exceeds 64 bits."""
    match = _SIZE.fullmatch(text)
    if match is None:
        return None
    number = decimal(match.group(1))
    if number is None:
        return None
    size = number * _UNITS[match.group(2).lower()]
    return size if size < FIGURE_LIMIT else None


# ------------------------------------------------------------------------------- jcmd VM.flags
def parse_vm_flags(text: str) -> dict[str, str]:
    """`Name -> value` of the `-XX:Name=value` words of a `VM.flags` answer (booleans are skipped)."""
    flags: dict[str, str] = {}
    for word in text[:MAX_TEXT].split()[:MAX_WORDS]:
        match = _FLAG.fullmatch(word)
        if match is not None:
            flags[match.group(1)] = match.group(2)
    return flags


def limits_from_vm_flags(text: str) -> JvmLimits | None:
    """The ceilings a `VM.flags` answer states, or None when it names no `MaxHeapSize` (not the answer)."""
    flags = parse_vm_flags(text)
    heap = _figure(flags.get("MaxHeapSize"))
    if heap is None or heap == 0:
        return None
    direct = _figure(flags.get("MaxDirectMemorySize"))
    metaspace = _figure(flags.get("MaxMetaspaceSize"))  # max_uintx (not set) is wider than 64 bits
    shown = [f"MaxHeapSize={heap}"]
    if direct:
        shown.append(f"MaxDirectMemorySize={direct}")
    if metaspace:
        shown.append(f"MaxMetaspaceSize={metaspace}")
    return JvmLimits(
        heap,
        direct or heap,
        metaspace or None,
        "VM.flags",
        " ".join(shown),
        direct_set=bool(direct),
    )


def _figure(value: str | None) -> int | None:
    return None if value is None else decimal(value)


# ------------------------------------------------------------------------------- the options it started with
def launcher_options(argv: list[str]) -> list[str]:
    """The JVM options of a `java` command line: the words before the main class, `-jar FILE` or
    `-m MODULE` (what follows is the program's own arguments); empty for another program, whose
    arguments are not the JVM's."""
    if not is_java_launcher(argv):
        return []
    options: list[str] = []
    words = iter(argv[1 : MAX_WORDS + 1])
    for word in words:
        if word in _WITH_VALUE:
            next(words, None)
        elif word in _MAIN_NEXT or not word.startswith("-"):
            break
        else:
            options.append(word)
    return options


def startup_options(argv: list[str], environ: dict[str, str]) -> list[str]:
    """Every option the JVM read at start, in the order it applied them (the last one wins)."""
    tool, jdk, forced = (environ.get(name, "").split()[:MAX_WORDS] for name in OPTION_VARS)
    if not is_java_launcher(argv):
        return [*tool, *forced]  # JDK_JAVA_OPTIONS is the `java` launcher's alone
    return [*tool, *jdk, *launcher_options(argv), *forced]


def is_java_launcher(argv: list[str]) -> bool:
    return bool(argv) and argv[0].rsplit("/", 1)[-1] == "java"


def limits_from_options(options: list[str], cgroup: int | None, host: int | None) -> JvmLimits | None:
    """The ceilings the options set, or None when they set no heap ceiling. A share of the RAM is of
    `-XX:MaxRAM` when set, else of the cgroup limit (`cgroup`, None: unlimited) within the host's RAM
    (`host`), or of the host's alone with `-XX:-UseContainerSupport`."""
    heap = direct = metaspace = ram = None
    switches = [
        w for w in options[:MAX_WORDS] if w in ("-XX:+UseContainerSupport", "-XX:-UseContainerSupport")
    ]
    contained = not switches or switches[-1] == "-XX:+UseContainerSupport"
    memory = min(cgroup, host or cgroup) if cgroup is not None and contained else host
    percent: float | None = None
    fraction: int | None = None
    said: dict[str, str] = {}
    for word in options[:MAX_WORDS]:
        name, value = _option(word)
        if name is None or value is None:
            continue
        if name in ("MaxHeapSize", "MaxDirectMemorySize", "MaxMetaspaceSize", "MaxRAM"):
            size = parse_size(value)
            if size is None:
                continue
            if name == "MaxHeapSize":
                heap = size
            elif name == "MaxDirectMemorySize":
                direct = size
            elif name == "MaxMetaspaceSize":
                metaspace = size
            else:
                ram = size
        elif name == "MaxRAMPercentage" and _PERCENT.fullmatch(value) and 0 < float(value) <= 100:
            percent = float(value)
        elif name == "MaxRAMFraction" and (parts := decimal(value)) and parts <= 1024:
            fraction = parts
        else:
            continue
        said[name] = word
    seen = ram if ram is not None else memory
    if heap is None and seen is not None and (percent is not None or fraction is not None):
        heap = int(seen * percent / 100) if percent is not None else seen // (fraction or 1)
        base = "-XX:MaxRAM" if ram is not None else "the memory the JVM sees"
        said["MaxHeapSize"] = f"{said.get('MaxRAMPercentage') or said.get('MaxRAMFraction')} of {base}"
    if not heap:
        return None
    shown = [said[key] for key in ("MaxHeapSize", "MaxDirectMemorySize", "MaxMetaspaceSize") if key in said]
    return JvmLimits(heap, direct or heap, metaspace or None, "command line", " ".join(shown), bool(direct))


def _option(word: str) -> tuple[str | None, str | None]:
    """(flag name, value) of one option that sets a ceiling, else (None, None)."""
    if word.startswith("-Xmx"):
        return "MaxHeapSize", word[4:]
    if word.startswith("-XX:") and "=" in word:
        name, value = word[4:].split("=", 1)
        return name, value
    return None, None
