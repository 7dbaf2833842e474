"""Command-line front: one module per subcommand; each parses and validates, then calls a stage API."""
