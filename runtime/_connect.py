"""How a ``tether`` command reaches the running owner of a database: one rule for every command that asks it
something (``submit``, ``runs``, ``watch``, ``abort``, ``usage``, ...)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final

import actors
from protocol import OwnerUnavailable, Role, TetherError

OWNER_WAIT_S: Final = 5.0
"""How long a command waits for an owner to answer (one that is starting, or restarting under ``tether up``) before
it exits with :class:`~protocol.OwnerUnavailable`."""


READ_ADVICE: Final = "Pass --db the path of a Tether database (the file a Tether owner serves)."
"""What to do about a foreign file, for the commands that read a database or ask its owner."""


def check_db(db: str) -> str:
    """``db`` as an absolute path; at once, :class:`OwnerUnavailable` if there is no such database, and
    :class:`~protocol.NotATetherDatabase` (exit 5) if the file is not a Tether database (read without writing)."""
    from storage_owner.store import MIGRATIONS, refuse_foreign

    db = os.path.abspath(db)
    if not os.path.exists(db):
        raise OwnerUnavailable(f"there is no database at {db}")
    refuse_foreign(db, MIGRATIONS, advice=READ_ADVICE)
    return db


@asynccontextmanager
async def connect(
    db: str, name: str, *, role: Role = "client", warn: Callable[[str], None] | None = None
) -> AsyncIterator[actors.Client]:
    """A client of the running owner of ``db``, named ``name``, waiting up to :data:`OWNER_WAIT_S` for it. ``warn``
    (a command that waits, which a person watches): one line when the owner stops answering, one when it answers
    again (the client reconnects by itself meanwhile), never one per attempt."""
    on_attempt = None if warn is None else _reach_reports(db, name, warn)
    async with actors.connect(
        db=db, role=role, name=name, wait_for_owner_s=OWNER_WAIT_S, on_attempt=on_attempt
    ) as client:
        yield client


def _reach_reports(db: str, name: str, warn: Callable[[str], None]) -> Callable[[TetherError | None, float], None]:
    """``actors.connect``'s ``on_attempt``, told to a person: the first failed attempt of a silence, then its end."""
    away = False

    def attempted(error: TetherError | None, backoff_s: float) -> None:
        nonlocal away
        if error is None:
            if away:
                warn(f"{name}: the owner of {db} answers again")
            away = False
        elif not away:
            away = True
            warn(f"{name}: the owner of {db} does not answer ({error}); trying again until it does")

    return attempted
