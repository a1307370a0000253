"""The ground: errors, units, records, shared types, the metric catalog, ports. Imports nothing of medic."""
