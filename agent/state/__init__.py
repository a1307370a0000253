"""What the agent keeps on disk: the SQLite store, the event log, histogram snapshots, adopted identities."""
