"""Offline series readers for `medic analyze` (JSON Lines, Prometheus query_range)."""
