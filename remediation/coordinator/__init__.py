"""Coordinator backends, selected by `remediation.coordinator.backend` (one table, lazy imports).

    local       SQLite file shared by the agents of one host
    etcd        etcd 3.4+ JSON gateway, for agents on several hosts
    kubernetes  designed (docs/remediation.md), not implemented: refused with a clear error

All pass one contract test suite (`tests/test_coordinator_contract.py`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from remediation.coordinator.base import Coordinator
from remediation.coordinator.records import AcquireResult, Admit, Grant, SlotRequest
from remediation.errors import RemediationError

if TYPE_CHECKING:
    from remediation.config import CoordinatorSection

BACKENDS: dict[str, str] = {
    "local": "remediation.coordinator.local:LocalCoordinator",
    "etcd": "remediation.coordinator.etcd:EtcdCoordinator",
}

__all__ = ["BACKENDS", "AcquireResult", "Admit", "Coordinator", "Grant", "SlotRequest", "create_coordinator"]


def create_coordinator(
    section: CoordinatorSection,
    *,
    state_dir: Path,
    retention: float,
    clock: Callable[[], float] | None = None,
) -> Coordinator:
    """Build the configured backend. `retention`: how long finished restarts are kept (≥ 1 h, ≥ cooldown)."""
    from remediation.config import KUBERNETES_NOT_YET

    if section.backend not in BACKENDS:
        if section.backend == "kubernetes":
            raise RemediationError(KUBERNETES_NOT_YET)
        raise RemediationError(
            f"unknown coordinator backend {section.backend!r}; known: {', '.join(sorted(BACKENDS))}"
        )
    module_name, _, class_name = BACKENDS[section.backend].partition(":")
    cls: Callable[..., Coordinator] = getattr(importlib.import_module(module_name), class_name)
    extra = {"clock": clock} if clock is not None else {}
    if section.backend == "local":
        path = section.local.path or Path(state_dir) / "coordinator.db"
        return cls(path, namespace=section.namespace, retention=retention, timeout=section.timeout, **extra)
    from remediation.coordinator.etcd_security import load_etcd_security

    return cls(
        section.etcd.endpoints,
        prefix=section.etcd.prefix,
        namespace=section.namespace,
        retention=retention,
        timeout=section.timeout,
        security=load_etcd_security(section.etcd.tls, section.etcd.auth),
        **extra,
    )
