"""``actors.serve``: attach to an owner as a worker, announce the app, keep a heartbeat, come back after losses."""

from __future__ import annotations

import math
import os
import socket

import trio

from protocol import Announce, OwnerUnavailable

from ._app import App
from ._client import Client, connect


async def serve(
    app: App,
    *,
    db: str | os.PathLike[str] | None = None,
    url: str | None = None,
    token: str | None = None,
    name: str = "",
    task_status: trio.TaskStatus[Client] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` as a worker until cancelled.

    Connects with role ``worker``, announces the app's capabilities (task kinds, tools, agents, each with its
    version) and re-announces after every reconnection; the client's heartbeat keeps the owner from declaring the
    worker gone. ``task_status.started`` receives the connected client (for ``nursery.start``).
    """
    announcement = Announce(
        call_id=0, pid=os.getpid(), host=socket.gethostname(), app=app.name, capabilities=app.capabilities()
    )
    started = False
    while True:
        try:
            async with connect(
                db, url=url, token=token, role="worker", name=name or f"worker-{os.getpid()}", wait_for_owner_s=math.inf
            ) as client:
                client.announcement = announcement  # re-sent by the client after every reconnection
                await client.announce(announcement)
                if not started:
                    started = True
                    task_status.started(client)
                await trio.sleep_forever()
        except OwnerUnavailable:
            continue  # the owner stayed away longer than a client waits for it: connect afresh, waiting again
