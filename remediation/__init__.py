"""Remediation: findings in, safe actions out (docs/remediation.md).

model       RemediationRequest, InstanceView, Decision, Intent, FleetEntry, RestartRecord, Plan, StepReport
config      RemediationSection (the `remediation:` config section)
policy      the ladder: purge → restart → escalate; crash-loop counting
budget      max_concurrent, min_interval, max_per_hour, cooldown: pure functions of (state, time)
planner     deadline-aware, as-late-as-safe, budget-spaced, deterministic fleet schedule
windows     allowed restart windows (days, hours, time zone)
blockers    min uptime, capacity floor, Prometheus alerts, windows
coordinator local (SQLite) and etcd backends: leased slots, shared history, shared fleet view
actuators   signal, exec, managed, http; drain; verify; evidence
ledger      actions, decisions, cases, starts, escalations, pause, in the agent's store
pause       the kill switch: held in memory at once, stored when the ledger can be written
engine      Engine.step(now, requests, instances): the pipeline, in one visible order

It sees the agent only through the ports of `agent.core.ports` (an event sink, a table store) and
the hooks it is given; the agent's glue (`agent.jobs.remediation`) builds its inputs.
"""
