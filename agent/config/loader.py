"""Reading the config: YAML text or a file in, a validated `Config` out, or a `ConfigError`.

Every problem is one line, `FILE: key.path: what was expected (got VALUE)`, all of them at once, so a
user fixes a file in one round; the key path leaves out pydantic's internal markers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from agent.config.model import Config
from agent.core.errors import ConfigError


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file; `ConfigError` lists every problem, one line each."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except PermissionError:
        raise ConfigError(f"{path}: permission denied: make it readable by the user running medic") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return parse_config(text, source=str(path))


def parse_config(text: str, source: str = "<config>") -> Config:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{where}: invalid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    return validate_config(data, source)


def validate_config(data: dict[str, Any], source: str = "<config>") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(err, source) for err in exc.errors())) from None


def _describe(err: Any, source: str) -> str:
    path = _key_path(err.get("loc", ()))
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return f"{source}: {path}: unknown key (check the spelling; see examples/medic.yaml)"
    message = err.get("msg", "invalid value")
    message = message.removeprefix("Value error, ")
    got = err.get("input")
    quiet = kind == "missing" or isinstance(got, (dict, list)) or "got " in message
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
