"""The `medic` command: one module per subcommand."""
