"""Detectors: pure functions of stored series that produce findings."""
