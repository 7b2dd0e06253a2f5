"""The client: ``actors.connect(db=... | url=..., token=...)``, the typed API over one connection.

The connection (``_connection.py``) is shared by every task that uses the client: requests are coalesced, replies
matched by ``call_id``. If it drops, calls in flight raise :class:`~protocol.ConnectionLost` (their outcome is
unknown), the client reconnects with back-off (re-reading the runtime file when it was opened with ``db=``, since a
restarted owner listens on a new port), and watches (``_watch.py``) resume from the last ``seq`` they delivered,
with no gap and no duplicate. Calls made while disconnected wait for the reconnection, at most
``reconnect_timeout_s``.

:class:`Client` joins the parts of the API, one per room of the owner they reach (``_conversations.py``,
``_tasks.py``, ``_runs.py``, ``_usage.py``, ``_peers.py``), each on :class:`~actors._client._base.BaseClient`.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Callable

from protocol import TetherError, UsageError

from ._connection import RECONNECT_TIMEOUT_S, open_connection
from ._conversations import ConversationCalls
from ._peers import PeerCalls
from ._runs import RunCalls
from ._tasks import TaskCalls
from ._usage import UsageCalls


class Client(ConversationCalls, TaskCalls, RunCalls, UsageCalls, PeerCalls):
    """A connection to one owner. Create it with :func:`connect`; every method is a trio checkpoint.

    The typed API over one :class:`~actors._client._connection.Connection` (which reconnects, matches replies and
    feeds watches); :attr:`connection` is that layer, under the client's calls (and a worker's hooks).
    """


@contextlib.asynccontextmanager
async def connect(
    db: str | os.PathLike[str] | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
    role: str = "client",
    name: str = "",
    reconnect: bool = True,
    reconnect_timeout_s: float = RECONNECT_TIMEOUT_S,
    wait_for_owner_s: float = 0.0,
    ca: str | os.PathLike[str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    on_attempt: Callable[[TetherError | None, float], None] | None = None,
) -> AsyncIterator[Client]:
    """Connect to the owner of ``db`` (found through its runtime file) or at ``url`` with ``token``.

    A ``wss://`` owner is verified against ``ca`` (a PEM file of the CA that signed its certificate; for a
    self-signed certificate, the certificate itself), or the CA the runtime file names (``db=``), or the system's
    CAs; ``ssl_context`` replaces all of that with a context of your own.

    ``role`` is ``"client"`` (read and write), ``"reader"`` (read and watch only) or ``"worker"``. Raises
    :class:`~protocol.OwnerUnavailable` if no owner can be reached within ``wait_for_owner_s`` (0: try once; an
    owner that is starting or restarting is waited for otherwise), :class:`~protocol.HandshakeRefused` if the owner
    refuses the token, version or role, and :class:`~protocol.UsageError`, before trying anything, for what no
    retry can mend: both or neither of ``db`` and ``url``, a ``url`` that is not ``ws://`` or ``wss://``, a ``url``
    without ``token``, a ``ca`` file that cannot be read as PEM. ``on_attempt`` is called after each failed attempt
    to reach the owner (while waiting for it, or reconnecting) with why and the back-off before the next, and with
    ``(None, 0.0)`` when an attempt after failures succeeds (:func:`actors.serve` logs them).
    """
    check_target(db=db, url=url, token=token, ca=ca, ssl_context=ssl_context)
    async with open_connection(
        db=None if db is None else os.fspath(db),
        url=url,
        token=token,
        role=role,
        name=name,
        reconnect=reconnect,
        reconnect_timeout_s=reconnect_timeout_s,
        wait_for_owner_s=wait_for_owner_s,
        ca=None if ca is None else os.fspath(ca),
        ssl_context=ssl_context,
        on_attempt=on_attempt,
    ) as connection:
        yield Client(connection)


def check_target(
    *,
    db: str | os.PathLike[str] | None,
    url: str | None,
    token: str | None,
    ca: str | os.PathLike[str] | None,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Raise :class:`~protocol.UsageError` for a way to reach an owner that no retry can mend (see :func:`connect`);
    nothing is tried. The owner's absence is not such an error: a runtime file that is missing now may appear."""
    if (db is None) == (url is None):
        raise UsageError("connect() needs exactly one of db=PATH or url=URL")
    if url is None:
        return
    if not url.startswith(("ws://", "wss://")):
        raise UsageError(f"an owner's url starts with ws:// or wss://, not {url!r}; nothing was tried")
    if not token:
        raise UsageError(
            f"connecting to the owner at {url} needs its access token (token=..., or TETHER_TOKEN for tether "
            "worker): it is in DB.runtime.json on the owner's host; nothing was tried"
        )
    if ca is not None and ssl_context is None and url.startswith("wss://"):
        try:
            ssl.create_default_context(cafile=os.fspath(ca))
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(
                f"cannot use the CA certificate {os.fspath(ca)} to verify the owner at {url}: {exc}; give a readable "
                "PEM file (the CA that signed the owner's certificate, or the certificate itself if self-signed); "
                "nothing was tried"
            ) from exc
