"""The exit statuses of the ``tether`` commands: what the command line returns, and what ``tether up`` reads from the
owner and the workers it starts (so the supervisor and the command line import them from here, not each other)."""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_ALREADY_RUNNING: Final = 3
EXIT_SCHEMA_TOO_NEW: Final = 4
EXIT_NOT_TETHER_DATABASE: Final = 5
EXIT_DATABASE_DAMAGED: Final = 6
EXITS_FINAL: Final = frozenset(
    {EXIT_USAGE, EXIT_ALREADY_RUNNING, EXIT_SCHEMA_TOO_NEW, EXIT_NOT_TETHER_DATABASE, EXIT_DATABASE_DAMAGED}
)
"""Exit statuses of ``tether owner`` that retrying cannot change: ``tether up`` stops at once with the same one."""
