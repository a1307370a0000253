"""Remediation: findings in, safe actions out (docs/remediation.md).

model       RemediationRequest, InstanceView, Decision, Intent, FleetEntry, RestartRecord, Plan
config      RemediationSection (the `remediation:` config section)
policy      the ladder: purge → restart → escalate; crash-loop counting
budget      max_concurrent, min_interval, max_per_hour, cooldown: pure functions of (state, time)
planner     deadline-aware, as-late-as-safe, budget-spaced, deterministic fleet schedule
windows     allowed restart windows (days, hours, time zone)
blockers    min uptime, capacity floor, Prometheus alerts, windows
coordinator local (SQLite) and etcd backends: leased slots, shared history, shared fleet view
actuators   signal, exec, managed, http; drain; verify; evidence
ledger      actions, decisions, cases, starts, escalations, pause, in the agent's store
engine      Engine.step(now, requests, instances): the pipeline, in one visible order
views       adapters from the agent's tracker
"""
