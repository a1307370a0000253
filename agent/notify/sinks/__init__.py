"""One module per target format; `create_sinks(config)` builds them in config order, by name.

An Alertmanager sink with `urls` (the replicas of an HA Alertmanager) becomes one sink per replica,
`NAME@HOST:PORT`, so that each replica has its own outbox queue: one that is down is retried
without sending again to the ones that accepted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.notify.config import (
    AlertmanagerSinkSpec,
    NotifySection,
    SlackSinkSpec,
    WebhookSinkSpec,
    replica_names,
    sink_names,
)
from agent.notify.sinks.alertmanager import AlertmanagerSink
from agent.notify.sinks.base import DeliveryError, HttpSink
from agent.notify.sinks.slack import SlackSink
from agent.notify.sinks.webhook import WebhookSink

if TYPE_CHECKING:
    import httpx

__all__ = [
    "AlertmanagerSink",
    "DeliveryError",
    "HttpSink",
    "SlackSink",
    "WebhookSink",
    "create_sinks",
    "replica_names",
]


def create_sinks(config: NotifySection, *, transport: httpx.BaseTransport | None = None) -> list[HttpSink]:
    """The configured sinks with their secrets resolved; `ConfigError` names the sink when one is missing."""
    sinks: list[HttpSink] = []
    for index, (spec, name) in enumerate(zip(config.sinks, sink_names(config.sinks))):
        where = f"notify.sinks[{index}]"
        if isinstance(spec, AlertmanagerSinkSpec):
            for url, replica in zip(spec.replicas, replica_names(name, spec), strict=True):
                sinks.append(AlertmanagerSink(replica, spec, where, url=url, group=name, transport=transport))
        elif isinstance(spec, WebhookSinkSpec):
            sinks.append(WebhookSink(name, spec, where, transport=transport))
        elif isinstance(spec, SlackSinkSpec):
            sinks.append(SlackSink(name, spec, where, transport=transport))
    return sinks
