"""Instances and their processes: discovery, the tracker, managed children, the collector."""
