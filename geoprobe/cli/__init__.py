"""The `geoprobe` command line: one module per command, no science in here."""
