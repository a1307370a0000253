"""What every route reads: the parts the runtime built, and the settings the API answers by.

One record, so that each router (`app.py`, `histograms.py`, `instances.py`, `outbox.py`,
`alertmanager.py`) sees the same parts by the same names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agent.api.guard import DEFAULT_MAX_BODY
from agent.api.metrics import Telemetry
from agent.jobs.detection import Detection
from agent.jobs.remediation import Remediation
from agent.notify.config import NotifySection
from agent.state.eventlog import EventLog
from agent.state.store import Store
from agent.watch.tracker import Tracker


@dataclass
class ApiContext:
    tracker: Tracker
    store: Store
    telemetry: Telemetry
    events: EventLog
    token: str
    detection: Detection
    remediation: Remediation | None = None
    started_at: float = field(default_factory=time.time)
    config_path: str | None = None
    notify: NotifySection = field(default_factory=NotifySection)
    allowed_hosts: frozenset[str] | None = None  # Host names answered; None: loopback only
    max_body: int = DEFAULT_MAX_BODY  # request bodies, except the Alertmanager receiver's
    time_scale: float = 1.0  # agent.time_scale: above 1, windows and deadlines are compressed (a demo)
    agent_name: str | None = None  # the `agent` label of this agent's alerts (agent.name)
