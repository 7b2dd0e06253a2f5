"""What the I/O shells of the owner and of its peers share.

A public module that ``protocol/__init__`` does not import: it imports trio and trio_websocket, and ``import
protocol`` stays free of I/O modules (the sans-IO core imports protocol; tests/unit/test_core_purity.py checks).
The owner's server and the client's connection both import it from here.
"""

from __future__ import annotations

import sys
from typing import Final

import trio
import trio_websocket

PEER_GONE: Final = (
    trio_websocket.ConnectionClosed,
    trio_websocket.HandshakeError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    OSError,
)
"""What sending or receiving on a WebSocket raises once the other side went away: the end of that connection
(handled by closing it, or by reconnecting), never of the process."""


def log_stderr(line: str) -> None:
    """The default log of the owner and of a worker: one line to stderr, flushed."""
    print(line, file=sys.stderr, flush=True)
