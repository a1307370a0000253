"""Agent-level metrics of notifications and the receiver, served from snapshots (no query at scrape time).

medic_notify_queue_depth{sink}                   pending items in the outbox
medic_notify_oldest_pending_age_seconds{sink}    age of the oldest pending item (0 when none)
medic_notify_dead_letters{sink}                  dead letters kept in the store
medic_notify_deliveries_total{sink}              deliveries accepted by the target
medic_notify_delivery_failures_total{sink}       failed attempts (each retry counts)
medic_notify_dead_lettered_total{sink}           items given up on
medic_notify_last_success_timestamp_seconds{sink}
medic_notify_silences{sink}                      Alertmanager silences medic holds now
medic_receiver_alerts_total{result}              alerts received: opened, duplicate, resolved, ...
medic_receiver_rejected_total{reason}            payloads refused: auth, json, schema, size, instance
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.notify.outbox import SinkStats

NOTIFY_METRICS = (
    "medic_notify_queue_depth",
    "medic_notify_oldest_pending_age_seconds",
    "medic_notify_dead_letters",
    "medic_notify_deliveries",
    "medic_notify_delivery_failures",
    "medic_notify_dead_lettered",
    "medic_notify_last_success_timestamp_seconds",
    "medic_notify_silences",
)


@dataclass
class NotifySnapshot:
    now: float = 0.0
    sinks: dict[str, SinkStats] = field(default_factory=dict)
    silences: dict[str, int] = field(default_factory=dict)


class NotifyCollector(Collector):
    def __init__(self) -> None:
        self.snapshot = NotifySnapshot()

    def update(self, snapshot: NotifySnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        depth = GaugeMetricFamily(NOTIFY_METRICS[0], "Notifications waiting in the outbox.", labels=["sink"])
        age = GaugeMetricFamily(NOTIFY_METRICS[1], "Age of the oldest waiting notification.", labels=["sink"])
        dead = GaugeMetricFamily(NOTIFY_METRICS[2], "Dead letters kept in the outbox.", labels=["sink"])
        delivered = CounterMetricFamily(
            NOTIFY_METRICS[3], "Notifications the target accepted.", labels=["sink"]
        )
        failures = CounterMetricFamily(NOTIFY_METRICS[4], "Failed delivery attempts.", labels=["sink"])
        lettered = CounterMetricFamily(NOTIFY_METRICS[5], "Notifications given up on.", labels=["sink"])
        success = GaugeMetricFamily(NOTIFY_METRICS[6], "When the sink last accepted one.", labels=["sink"])
        silences = GaugeMetricFamily(NOTIFY_METRICS[7], "Alertmanager silences medic holds.", labels=["sink"])
        for name, stats in sorted(snap.sinks.items()):
            depth.add_metric([name], stats.pending)
            age.add_metric([name], max(0.0, snap.now - stats.oldest_pending) if stats.oldest_pending else 0.0)
            dead.add_metric([name], stats.dead)
            delivered.add_metric([name], stats.delivered_total)
            failures.add_metric([name], stats.failures_total)
            lettered.add_metric([name], stats.dead_total)
            if stats.last_success:
                success.add_metric([name], stats.last_success)
        for name, count in sorted(snap.silences.items()):
            silences.add_metric([name], count)
        yield from (depth, age, dead, delivered, failures, lettered, success, silences)


RECEIVER_METRICS = ("medic_receiver_alerts", "medic_receiver_rejected")


class ReceiverCollector(Collector):
    """Counts of the receiver's outcomes; `count()` is called from request handlers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.alerts: dict[str, int] = {}
        self.rejected: dict[str, int] = {}

    def count(self, table: str, key: str, n: int = 1) -> None:
        with self._lock:
            counts = self.alerts if table == "alerts" else self.rejected
            counts[key] = counts.get(key, 0) + n

    def collect(self) -> Iterator[Metric]:
        alerts = CounterMetricFamily(
            RECEIVER_METRICS[0], "Alerts received from Alertmanager.", labels=["result"]
        )
        rejected = CounterMetricFamily(RECEIVER_METRICS[1], "Receiver payloads refused.", labels=["reason"])
        with self._lock:
            for key, n in sorted(self.alerts.items()):
                alerts.add_metric([key], n)
            for key, n in sorted(self.rejected.items()):
                rejected.add_metric([key], n)
        yield from (alerts, rejected)
