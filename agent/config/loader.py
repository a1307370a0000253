"""Reading the config: YAML text or a file in, a validated `Config` out, or a `ConfigError`.

Every problem is one line, `FILE: key.path: what was expected (got VALUE)`, all of them at once, so a
user fixes a file in one round; the key path leaves out pydantic's internal markers.

String values of a config file may name environment variables: `${NAME}`, or `${NAME:-default}` for
a default used when NAME is unset or empty (as in a shell). Only that form is read: a `$` anywhere
else (a regex's `$`, `$NAME`) stays as written, `$${` is a literal `${`, keys are never expanded, and
an expanded value is not expanded again. An unset variable without a default is an error naming the
key and the variable. Expansion runs on the parsed YAML, so a value cannot inject YAML structure.
A problem with a value that came from the environment names the key and the `${NAME}` reference as
the file writes it, never the expanded value: a secret given under the wrong key is not printed.

A key given twice in one mapping is refused with both lines: YAML would keep the last one silently.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from agent.config.model import Config
from agent.config.timescale import problems as time_problems
from agent.core.bounded import read_regular_file
from agent.core.errors import ConfigError, UnsafePath

MAX_CONFIG_BYTES = 4 * 2**20  # a config is kilobytes; more is a wrong path (a log, a device)
MAX_CONFIG_NODES = 100_000  # values once YAML aliases are expanded: a billion laughs stops here


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file; `ConfigError` lists every problem, one line each.

    Only a regular file (or a symlink to one) of at most `MAX_CONFIG_BYTES` is read: a FIFO would
    block the agent's start for ever and a device would never end."""
    path = Path(path)
    try:
        text = read_regular_file(path, MAX_CONFIG_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except PermissionError:
        raise ConfigError(f"{path}: permission denied: make it readable by the user running medic") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a YAML file") from None
    except UnsafePath as exc:
        raise ConfigError(f"{exc}; give a YAML file of at most {MAX_CONFIG_BYTES // 2**20} MiB") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return parse_config(text, source=str(path))


# `$${` (a literal `${`) or `${NAME}` / `${NAME:-default}`; NAME as a POSIX shell names variables
_REFERENCE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
MAX_EXPANDED = 65536  # characters of one value after expansion: a config value, not a payload
# an expanded value this long is masked wherever an error message would quote it (shorter ones are
# figures and words that messages use for themselves: "1", "on")
MIN_MASKED = 4
# the head of an expanded value that, still seen in a message about its key, means the message
# quotes it (cut short, or escaped): the message is then not shown
SECRET_HEAD = 12

# key path -> (the value as the file writes it, with its ${NAME}; the value once expanded)
Expanded = dict[str, tuple[str, str]]


def expand_env(data: Any, environ: Mapping[str, str] | None = None, source: str = "<config>") -> Any:
    """`data` (parsed YAML) with `${NAME}` / `${NAME:-default}` in its string values replaced from
    `environ` (default `os.environ`); `ConfigError` lists every unset variable, one line each."""
    return _expand(data, environ, source)[0]


def _expand(data: Any, environ: Mapping[str, str] | None, source: str) -> tuple[Any, Expanded]:
    """`expand_env`, and which values took something from the environment (by key path)."""
    env = os.environ if environ is None else environ
    problems: list[str] = []
    expanded: Expanded = {}

    def expand(value: str, path: str) -> str:
        if "$" not in value:
            return value

        def replace(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name is None:
                return "${"
            found = env.get(name)
            if found:
                return found
            if default is not None:
                return default
            state = "is empty" if found == "" else "is not set"
            problems.append(
                f"{source}: {path or '<top>'}: environment variable {name} {state} "
                f"(set it, or give a default: ${{{name}:-VALUE}})"
            )
            return ""

        result = _REFERENCE.sub(replace, value)
        if result != value:
            expanded[path] = (value, result)
        if len(result) > MAX_EXPANDED:
            problems.append(f"{source}: {path}: over {MAX_EXPANDED} characters after expanding ${{…}}")
        return result

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, str):
            return expand(node, path)
        if isinstance(node, dict):
            return {key: walk(value, f"{path}.{key}" if path else str(key)) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(item, f"{path}[{index}]") for index, item in enumerate(node)]
        return node

    result = walk(data, "")
    if problems:
        raise ConfigError("\n".join(problems))
    return result, expanded


def parse_config(text: str, source: str = "<config>", environ: Mapping[str, str] | None = None) -> Config:
    """Parse YAML text, expand `${ENV}` references in its values, and validate it."""
    try:
        data = _load_yaml(text, source)
    except RecursionError:
        raise ConfigError(f"{source}: the YAML nests too deep to be a config") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{where}: invalid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        expanded, from_env = _expand(data, environ, source)
        return validate_config(expanded, source, from_env)
    except RecursionError:
        raise ConfigError(f"{source}: the YAML nests too deep to be a config") from None


def _load_yaml(text: str, source: str) -> Any:
    """`yaml.safe_load`, refusing a document whose aliases expand to more than `MAX_CONFIG_NODES`
    values, or refer to themselves, before anything walks the expanded tree."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        duplicates = [
            f"{source}:{_at(again)}: key {again.value!r} is given twice in one mapping (first at "
            f"line {_at(first)}); YAML would keep only the last: remove one"
            for first, again in sorted(_duplicate_keys(node), key=lambda pair: _position(pair[1]))
        ]
        if duplicates:
            raise ConfigError("\n".join(duplicates))
        if _expanded_size(node) > MAX_CONFIG_NODES:
            raise ConfigError(
                f"{source}: the YAML's anchors and aliases expand to more than {MAX_CONFIG_NODES} values "
                "(or refer to themselves); write the values out"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes the tree has once every alias is copied out; above the bound on a cycle."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            open_nodes.discard(key)
            sizes[key] = min(1 + sum(sizes[id(c)] for c in children), MAX_CONFIG_NODES + 1)
            continue
        if key in sizes:
            continue
        if key in open_nodes:  # an alias inside its own anchor: infinite once expanded
            return MAX_CONFIG_NODES + 1
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def _duplicate_keys(root: yaml.Node) -> Iterator[tuple[yaml.Node, yaml.Node]]:
    """(first, repeated) key nodes of every mapping that gives a plain key twice; a merge (`<<`) is
    not a key of its own, and a key it brings in may be overridden, as YAML means it."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: dict[str, yaml.Node] = {}
            for key, _ in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                    continue
                if key.value in keys:
                    yield keys[key.value], key
                else:
                    keys[key.value] = key
        stack.extend(_children(node))


def _position(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line, node.start_mark.column


def _at(node: yaml.Node) -> str:
    return f"{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def validate_config(
    data: dict[str, Any], source: str = "<config>", from_env: Expanded | None = None
) -> Config:
    """`data` as a `Config`; `ConfigError` lists every problem. `from_env`: the values that took
    something from the environment, which no message may quote."""
    hidden = from_env or {}
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(err, source, hidden) for err in exc.errors())) from None
    # every window medic judges holds samples, and the store keeps the history the memory detectors
    # read at their resolution: checked on the whole config, once every section is valid
    problems = time_problems(config)
    if problems:
        raise ConfigError(_mask(f"{source}: <top>: {'; '.join(problems)}", hidden))
    return config


def _describe(err: Any, source: str, hidden: Expanded) -> str:
    path = _key_path(err.get("loc", ()))
    secret = hidden.get(path)
    if secret is not None and err.get("type") not in _QUIET_KINDS:
        return _mask(_describe_secret(err, source, path, *secret), hidden)
    return _mask(_describe_plain(err, source, path), hidden)


def _describe_secret(err: Any, source: str, path: str, written: str, value: str) -> str:
    """The problem with a value from the environment: the key, what was expected and the reference
    as written (`${TOKEN}`), never the value."""
    message = err.get("msg", "invalid value").removeprefix("Value error, ")
    message = message.replace(value, written)
    if len(value) >= MIN_MASKED and value[:SECRET_HEAD] in message:  # quoted cut short or escaped
        message = "invalid value"
    said = "its value" if written in message else f"the value of {written!r}"
    return f"{source}: {path}: {message} ({said} comes from the environment and is not shown)"


def _mask(line: str, hidden: Expanded) -> str:
    """`line` with every expanded value long enough to be a secret replaced by its reference."""
    for written, value in hidden.values():
        if len(value) >= MIN_MASKED:
            line = line.replace(value, written)
    return line


_QUIET_KINDS = ("extra_forbidden", "missing")  # their lines never quote the value


def _describe_plain(err: Any, source: str, path: str) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return f"{source}: {path}: unknown key (check the spelling; see examples/medic.yaml)"
    if kind == "missing":
        return f"{source}: {path}: required, and has no default (see examples/medic.yaml)"
    message = err.get("msg", "invalid value")
    message = message.removeprefix("Value error, ")
    got = err.get("input")
    quiet = isinstance(got, (dict, list)) or "got " in message
    shown = "" if quiet else f" (got {got!r})"
    return f"{source}: {path or '<top>'}: {message}{shown}"


def _key_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-", "literal[", "constrained-")) or "[" in str(part):
            continue  # pydantic's union-branch markers are noise for a user
        else:
            out += f".{part}" if out else str(part)
    return out


def dump_config(config: Config) -> str:
    """The effective config as YAML, with durations in seconds and sizes in bytes."""
    return yaml.safe_dump(config.model_dump(mode="json", by_alias=True), sort_keys=False)
