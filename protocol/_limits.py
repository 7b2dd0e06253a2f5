"""Limits the owner enforces and its peers respect, defined once for both sides."""

from __future__ import annotations

from typing import Final

MAX_LEASES_PER_WORKER: Final = 100_000
"""The owner's limit on a worker's ``max_leases`` (an ``announce`` over it is refused as ``invalid``)."""
MAX_ANNOUNCE_BYTES: Final = 256 << 10
"""An ``announce`` frame, encoded without its ``leases``, holds at most this many bytes (256 KiB: its capabilities,
host and app), so one peer's entry always fits a page of ``read_peers`` (refused as ``invalid`` past it; nothing
changed)."""
HEARTBEATS_PER_SILENCE: Final = 4
"""A peer sends something at least every ``heartbeat_ms``, a quarter of the silence after which the other side gives
the connection up (the owner closes it and cuts off its leases; a client reconnects): three heartbeats in a row may
be late before that."""
DEFAULT_HEARTBEAT_TIMEOUT_S: Final = 20.0
"""``tether owner --heartbeat-timeout`` (and ``up``'s): a peer silent this long is dropped; peers send something every
quarter of it, every 5 s. Not shorter: every heartbeat wakes both sides, and an idle ``tether up`` is mostly
heartbeats (with 10 s, pings every 2.5 s, an idle ``tether up`` used 0.36 % of a core against 0.22 %); a stopped
worker's leases are cut off after 20 s, a dead one's at once (its connection closes)."""
DEFAULT_MAX_LEASES: Final = 64
"""Phases a worker runs at once unless told otherwise (``actors.serve``, ``tether worker``)."""
MAX_PARTIAL_BYTES: Final = 1 << 20
"""A model request's streamed output is stored up to this many bytes (UTF-8) per attempt (1 MiB): a piece past it is
refused (``invalid``), and a worker stops sending pieces before it; the whole answer still commits with the result."""
MAX_PARTIAL_PIECE_BYTES: Final = 256 << 10
"""One ``append_partial`` piece carries at most this many bytes of text (a worker splits a longer one), so a piece
always fits a message."""
MAX_RESTART_LIMIT: Final = 1_000_000
"""The largest ``restart_limit`` a capability may announce (``None``: no limit); an ``announce`` past it is refused
as ``invalid``, and ``define_tool`` / ``define_agent`` / ``define_task`` / ``App`` refuse one at definition."""
MAX_TOOL_DIAGNOSTIC_CHARS: Final = 4000
"""A tool call's result says at most this many characters of why its structured value was dropped (``dropped`` on
``finish_operation``, refused as ``invalid`` past it)."""
MAX_RUN_ERROR_CHARS: Final = 2000
"""A run record's ``error`` (why it failed) holds at most this many characters: the owner cuts its task's error
text there, ending it with ``…`` (the task's outcome keeps the whole text)."""

MAX_PEER_NAME_CHARS: Final = 128
"""A ``hello``'s ``peer_name``: at most this many printable characters (refused as ``invalid`` otherwise)."""
MAX_TOKEN_CHARS: Final = 1024
"""A ``hello``'s ``token``: at most this many characters (refused as ``invalid`` before it is compared)."""
MAX_ROLE_CHARS: Final = 32
"""A ``hello``'s ``role``: at most this many characters (refused as ``invalid``; a shorter unknown role is
``role_not_allowed``)."""
