"""`etcd` coordinator: the fleet's rules over etcd 3.4+ (`etcd_store.py`), for agents on many hosts.

Keys under `<prefix>/<namespace>/` (the rules modules say what each means):
    slots/<instance>, restarts/<ms>-<instance>, clock     restart slots and history (`slots.py`)
    fleet/<instance>                                      what each agent publishes (`fleet_entries.py`)
    control/leader, grants/<agent>                        the elected planner (`seat.py`)
    control/pause                                         the fleet-wide pause (`controls.py`)
    profiles/<workload>                                   learned workload profiles (`profiles.py`)

Every agent reads `control/` once a step (and once more with its own `grants/<agent>` while it
wants a restart); only the leader watches, `fleet/`, which it reads every step. A follower
therefore costs a read a step, a lease keepalive every third of `fleet_ttl`, a write when its
entries change, and a slot acquisition when a grant comes due; it holds no stream or connection
open between steps, so etcd keeps only its keys and its lease for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from remediation.coordinator.base import Coordinator
from remediation.coordinator.controls import PAUSE
from remediation.coordinator.etcd_security import EtcdSecurity
from remediation.coordinator.etcd_store import EtcdStore

__all__ = ["PAUSE", "EtcdCoordinator"]


class EtcdCoordinator(Coordinator):
    name = "etcd"

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        prefix: str = "/medic",
        namespace: str = "default",
        retention: float = 86400.0,
        timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
        security: EtcdSecurity | None = None,
    ) -> None:
        store = EtcdStore(endpoints, prefix=prefix, namespace=namespace, timeout=timeout, security=security)
        super().__init__(store, retention=retention, clock=clock)
        self.gateway = store.gateway
        self.base = store.base
        self.namespace = namespace
