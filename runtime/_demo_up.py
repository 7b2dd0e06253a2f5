"""What the demo parts share: ``tether up`` started for a part, its output in ``DB.up.log``, stopped gracefully
when the part ends, however it ends."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping

import trio

from ._process import stop_gracefully, tether_command


@contextlib.asynccontextmanager
async def demo_up(
    db: str, *, workers: int, env: Mapping[str, str], new_log: bool = False
) -> AsyncIterator[tuple[trio.Process, str]]:
    """``tether up --db DB --workers N`` with ``env`` added to this process's environment, writing to
    ``DB.up.log`` (emptied first with ``new_log``, appended to otherwise): (its process, the log's path). It is
    stopped gracefully (SIGTERM, then SIGKILL past the grace) when the block ends."""
    log_path = db + ".up.log"
    with open(log_path, "wb" if new_log else "ab") as log:  # noqa: ASYNC230 (a local file handed to the child)
        up = await trio.lowlevel.open_process(
            tether_command("up", "--db", db, "--workers", str(workers)),
            stdout=log,
            stderr=log,
            env={**os.environ, **env},
        )
    try:
        yield up, log_path
    finally:
        await stop_gracefully(up)
