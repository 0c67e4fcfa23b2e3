"""The command layer: each `msgen` subcommand's run over a checked spec, the exit
statuses, the one atomic writer and the rendering of diagnostics."""
