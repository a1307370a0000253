"""Integrations with on-call tooling: notifications out, Alertmanager alerts in. See docs/alerts.md.

Out (events → people), in the order data flows:

    EventLog ──(subscriber wakes)──► Router ──► Outbox (SQLite) ──► sinks: alertmanager | webhook | slack
       events table, read by cursor    router.py    outbox.py            sinks/*.py
                                                   retries, dead letter

- `config.py`   the `notify:` section (sinks, min_severity, dashboard_url, runbook_url, retry, receiver)
- `event_alerts.py` which event kinds concern people, what each one does (the one table), and the
                description of each alert medic posts
- `model.py`    a notification: labels of the one label model (name, agent, fleet), summary,
                description, runbook and link
- `router.py`   events → per-sink outbox entries; the state of alerts that fire until resolved
- `outbox.py`   the durable queue: dedup keys, exponential backoff with jitter, dead letters
- `sinks/`      one module per target format; `signing.py` the HMAC shared with the receiver
- `silences.py` Alertmanager silences held while medic remediates an instance
- `service.py`  `Notifier`: the asyncio workers that run all of the above inside the agent

In (Alertmanager → findings): `inbound.py` parses webhook payloads (version 4) and maps alerts to
instances; `external.py` records `external` findings and emits `finding_opened`/`finding_resolved`;
`agent/api/alertmanager.py` is the HTTP endpoint.

This package's `__init__` imports nothing, so that `agent.config.model` can import `notify.config` cheaply.
"""
