"""segpipe orchestration: the run store, the chunk ledger, the CLI."""
