"""What the agent keeps on disk: the SQLite store, the event log, histogram snapshots, adopted identities.

The names below are the files of a state directory that other programs read too (the CLI, the demo):
one spelling for the writer and the readers.
"""

AGENT_FILE_NAME = "agent.json"  # the running agent's pid and API address, written once it listens
TOKEN_FILE_NAME = "admin.token"  # the admin token (0600) mutating CLI commands send
