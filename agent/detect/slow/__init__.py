"""The slow detector: the latency rules, the likely causes of a slowdown, the online judgement
(`detector`) and its replay over recorded latency series (`replay`). Like the memory detectors, it
imports only the records and tests shared at `agent/detect/`."""
