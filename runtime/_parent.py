"""How a supervised child notices that its supervisor is gone: its stdin pipe ends, or falls silent. (And how long,
by default, the supervisor lets a child go without answering: ``DEFAULT_LIVENESS_TIMEOUT_S``.)

The supervisor keeps a pipe to each child's stdin and writes a heartbeat byte to it every
``PARENT_HEARTBEAT_S``. A child started with ``--supervised`` exits cleanly once the pipe reaches end-of-file (the
supervisor died, however it died) or stays silent for ``PARENT_SILENCE_S`` (the supervisor is stopped or wedged).
No signals and no pid polling are involved.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

import trio

PARENT_HEARTBEAT_S: Final = 7.5
"""Seldom, so that idle children (and their supervisor) hardly wake: two heartbeats fit in the silence bound."""
PARENT_SILENCE_S: Final = 15.0
DEFAULT_LIVENESS_TIMEOUT_S: Final = 5.0
"""The other way round: ``tether up --liveness-timeout``, how long the supervisor lets its owner go without
answering, or an attached worker stay unattached while the owner answers, before it kills it (what it does then is
the supervisor's: ``runtime._supervisor``)."""


async def watch_parent(on_gone: Callable[[], object]) -> None:
    """Call ``on_gone`` once stdin ends or stays silent for too long (an owner cancels itself, a worker drains)."""
    stream = trio.lowlevel.FdStream(os.dup(0))
    async with stream:
        while True:
            with trio.move_on_after(PARENT_SILENCE_S) as silence:
                data = await stream.receive_some(4096)
            if silence.cancelled_caught or not data:
                on_gone()
                return
