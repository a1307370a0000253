"""Entry point of the `medic` command: parses arguments, dispatches to one module per subcommand,
and turns errors into one line on stderr and a defined exit code (the only place that does).

Each subcommand module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`,
and keeps heavy imports inside `run` so that `medic status` starts fast. The options every
subcommand shares (`agent.cli.options`) are added here, before or after the subcommand alike.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from agent import __version__
from agent.cli import client
from agent.cli.options import GLOBAL_OPTIONS, add_global_options, share_global_options
from agent.core.errors import ApiError, MedicError, UsageError
from agent.core.text import echo, printable

# subcommand -> module; the order is the order of `medic --help`
COMMANDS: dict[str, str] = {
    "run": "agent.cli.run",
    "demo": "agent.cli.demo",
    "status": "agent.cli.status",
    "events": "agent.cli.events",
    "leaks": "agent.cli.leaks",
    "analyze": "agent.cli.analyze",
    "config": "agent.cli.config_cmd",
    "warmup": "agent.cli.warmup",
    "guardrail": "agent.cli.guardrail",
    "histo": "agent.cli.histo",
    "heap": "agent.cli.heap",
    "plan": "agent.cli.plan",
    "actions": "agent.cli.actions",
    "evidence": "agent.cli.evidence",
    "clear": "agent.cli.clear",
    "restart": "agent.cli.restart",
    "pause": "agent.cli.pause",
    "resume": "agent.cli.resume",
    "purge": "agent.cli.purge",
    "doctor": "agent.cli.doctor",
    "hook": "agent.cli.hook",
    "completion": "agent.cli.completion",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `medic` parser; with `only`, just that subcommand (the others' modules stay unimported)."""
    parser = argparse.ArgumentParser(
        prog="medic",
        description="sidecar-medic: watch inference processes for leaks, fragmentation and slowness.",
    )
    parser.add_argument("--version", action="version", version=f"medic {__version__}")
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        share_global_options(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def chosen_command(argv: list[str]) -> str | None:
    """The subcommand `argv` names, when nothing before it but the shared options can change which
    it is; else None (help, a typo, an abbreviated option: the whole parser answers those)."""
    takes_value = {flag for flag, spec in GLOBAL_OPTIONS if spec.get("action") != "store_true"}
    known = {flag for flag, _ in GLOBAL_OPTIONS}
    tokens = iter(argv)
    for token in tokens:
        if token in COMMANDS:
            return token
        flag = token.split("=", 1)[0]
        if flag not in known:
            return None
        if flag in takes_value and "=" not in token and next(tokens, None) is None:
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # only the subcommand asked for is imported: `medic run` keeps the other 21 out of its RSS
    parser = build_parser(chosen_command(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):  # `medic` alone: a request for help, not a mistake
        parser.print_help()
        return 0
    try:
        return int(args._run(args) or 0)
    except MedicError as exc:
        echo(f"medic: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except UnicodeEncodeError as exc:
        if not _from_argv(exc):
            raise
        # a byte of the command line that is not UTF-8 (kept by Python as a lone surrogate) where
        # text must travel, e.g. in an instance name; reasons are mended by `options.free_text`
        echo(
            f"medic: error: an argument holds bytes that are not UTF-8 ({printable(exc.object)!s:.80}); "
            "retype it in UTF-8",
            file=sys.stderr,
        )
        return UsageError.exit_code
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        if not client.replies_received:
            raise
        # the agent answered a JSON object without the fields this command reads: another program
        # or another version at that address; one line that says so, not a traceback
        echo(
            f"medic: error: the agent's answer lacks what `medic {args.command}` reads "
            f"({type(exc).__name__}: {str(exc)[:200]}); is the address a medic agent of version "
            f"{__version__} (`medic --version`, GET /healthz)?",
            file=sys.stderr,
        )
        return ApiError.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def _from_argv(exc: UnicodeEncodeError) -> bool:
    """Whether the text that failed holds a surrogate that Python made of a byte of argv."""
    text = exc.object if isinstance(exc.object, str) else ""
    return any("\udc80" <= char <= "\udcff" for char in text[exc.start : exc.end])


if __name__ == "__main__":
    sys.exit(main())
