"""`medic warmup NAME --requests DIR`: replay requests to an instance until it answers fast enough.

    medic warmup serving-0 --requests warmup/ --url http://127.0.0.1:8501/v1/models/ranker:predict
    medic warmup serving-0 --requests warmup/ --config medic.yaml     # URL and target from the config

Without `--url`, the instance's `latency.canary.url` in the config (`--config`, else $MEDIC_CONFIG)
is the base URL, else the origin of its `latency.prometheus.url`; without `--target`, the
threshold of its `latency.slo`. Exit status 0 when warm, 1 when the deadline passed first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from agent.cli.options import duration
from agent.core.errors import UsageError
from agent.core.text import echo, printable

if TYPE_CHECKING:
    from agent.jobs.warmup import WarmupRequest

HELP = "replay warm-up requests to an instance until K in a row answer within a target latency"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__
    parser.add_argument("name", help="the instance (its config gives the URL and target unless given here)")
    parser.add_argument(
        "--requests", required=True, metavar="DIR", help=".http request files or bodies to POST"
    )
    parser.add_argument("--url", help="base URL the requests go to (paths in .http files are joined to it)")
    parser.add_argument("--config", "-c", help="config file with the instance (default $MEDIC_CONFIG)")
    parser.add_argument(
        "--target", type=duration, help="latency a request must stay within, e.g. 250ms (default: the SLO)"
    )
    parser.add_argument("--consecutive", "-k", type=int, default=5, help="requests in a row (default 5)")
    parser.add_argument(
        "--deadline", type=duration, default="2m", help="give up after this long (default 2m)"
    )
    parser.add_argument("--timeout", type=duration, default="5s", help="timeout of one request (default 5s)")
    parser.add_argument("--verbose", "-v", action="store_true", help="print every request")
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")


def _instance_latency(name: str, config_path: str | None) -> dict[str, Any]:
    """The instance's `latency` section as the config's JSON dump (pydantic types it `Any`), or {}."""
    if not config_path:
        return {}
    from agent.config.loader import load_config

    config = load_config(config_path)
    for spec in config.instances:
        if spec.name == name:
            return spec.model_dump(mode="json").get("latency") or {}
    known = ", ".join(spec.name for spec in config.instances) or "none"
    raise UsageError(f"no instance {name!r} in {config_path}; instances there: {known}")


def resolve(args: argparse.Namespace) -> tuple[str, float]:
    """The base URL and the latency target, from the flags or the instance's config."""
    from urllib.parse import urlsplit

    from agent.core.units import parse_duration

    latency = _instance_latency(args.name, args.config or os.environ.get("MEDIC_CONFIG"))
    url = args.url
    if not url and latency.get("canary"):
        url = latency["canary"]["url"]
    if not url and latency.get("prometheus"):
        parts = urlsplit(latency["prometheus"]["url"])
        url = f"{parts.scheme}://{parts.netloc}/"
    if not url:
        raise UsageError(
            f"no URL for {args.name}: give --url, or --config with latency.canary.url for the instance"
        )
    target = args.target
    if target is None and latency.get("slo"):
        target = latency["slo"]["threshold"]
    if target is None:
        raise UsageError("no latency target: give --target (e.g. 250ms) or a latency.slo for the instance")
    try:
        return url, parse_duration(target)
    except ValueError as exc:
        raise UsageError(f"--target: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from agent.core.units import parse_duration
    from agent.jobs.warmup import load_requests, replay_until_warm

    url, target = resolve(args)
    try:
        deadline, timeout = parse_duration(args.deadline), parse_duration(args.timeout)
    except ValueError as exc:
        raise UsageError(f"--deadline/--timeout: {exc}") from None
    if args.consecutive < 1 or deadline <= 0 or timeout <= 0 or target <= 0:
        raise UsageError("--consecutive must be at least 1; --target, --deadline and --timeout above 0")
    requests = load_requests(args.requests)

    def show(request: WarmupRequest, latency: float | None, error: str | None) -> None:
        took = f"{latency * 1000:8.1f}ms" if latency is not None else "       -  "
        line = f"{took}  {request.method} {printable(request.url(url))}"
        echo(line + (f"  {printable(error)}" if error else ""), flush=True)

    outcome = replay_until_warm(
        requests,
        url,
        target=target,
        consecutive=args.consecutive,
        deadline=deadline,
        timeout=timeout,
        on_request=show if args.verbose and not args.json else None,
    )
    if args.json:
        echo(
            json.dumps(
                {"instance": args.name, "url": url, "target_seconds": target, **outcome.to_dict()}, indent=2
            )
        )
    else:
        echo(f"{args.name}: {printable(outcome.reason)}", file=sys.stdout if outcome.warm else sys.stderr)
    return 0 if outcome.warm else 1
