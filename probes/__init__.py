"""Probes: each reads one kind of figure about one target process, behind one small interface.

See `probes.base.Probe` for the interface and `probes.registry` for the table of probes.
"""
