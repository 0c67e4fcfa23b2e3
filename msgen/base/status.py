"""The exit statuses of `msgen`, in one place, and the usage error every command and
run tool may raise (the command line turns it into status 2 and one line on stderr)."""

from __future__ import annotations

EXIT_OK, EXIT_ERRORS, EXIT_USAGE, EXIT_STALE, EXIT_INTERNAL = 0, 1, 2, 3, 70
# As a shell reports a process ended by SIGINT or SIGPIPE.
EXIT_INTERRUPTED, EXIT_PIPE = 130, 141


class UsageError(Exception):
    pass
