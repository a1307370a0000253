"""The agent's scheduled work that joins the parts: detection, remediation, purge, warm-up."""
