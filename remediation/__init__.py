"""Remediation: policy (finding → action ladder), planner, coordinator backends, actuators, verification.

Empty for now; the remediation engine fills it.
"""
