"""The `nestflow` command line: `nestflow demo`, `nestflow show DIR` (see nestflow.cli.main)."""
