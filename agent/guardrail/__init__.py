"""`medic guardrail`: a new build against the current one, side by side, before it ships (docs/guardrail.md).

`options` (what a run is asked), `servers` (launch, watch, stop), `driver` (the same requests to both,
ABBA), `measure` (medic's probes on both), `stats` (bootstrap, exact tests), `verdicts`, `run` (one
run start to end) and `report` (terminal, HTML, JUnit).
"""
