"""Tether's pytest plugin: opt-in fixtures for tests of your own agents and tasks (docs/testing.md). Loaded by the
``pytest11`` entry point of the ``tether`` distribution (or ``pytest_plugins = ["actors.testing.plugin"]`` in a
conftest); it defines no autouse fixture and imports nothing of Tether's until a test asks for a fixture.

The fixtures are async (pytest-trio, as Tether's own tests: ``trio_mode = true`` in your pytest configuration, or
``@pytest.mark.trio`` on each test):

- ``tether_db``: the path of a fresh database in the test's temporary directory (a ``str``);
- ``tether_owner``: a started :class:`~actors.testing.ScratchOwner` on ``tether_db``, on the manual clock; stopped
  and reaped after the test, whatever happened;
- ``tether_client``: an :class:`~actors.Client` of ``tether_owner``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from actors import Client
    from actors.testing import ScratchOwner


@pytest.fixture
def tether_db(tmp_path: Path) -> str:
    """A fresh database path in the test's temporary directory (the file is created by the owner)."""
    return str(tmp_path / "tether.db")


@pytest.fixture
async def tether_owner(tether_db: str) -> AsyncIterator[ScratchOwner]:
    """A started owner on ``tether_db`` on the manual clock; stopped and reaped after the test."""
    from actors.testing import ScratchOwner

    owner = ScratchOwner(tether_db)
    await owner.start()
    try:
        yield owner
    finally:
        await owner.aclose()


@pytest.fixture
async def tether_client(tether_owner: ScratchOwner) -> AsyncIterator[Client]:
    """A client of ``tether_owner`` (it reconnects across the owner's restarts)."""
    import actors

    async with actors.connect(tether_owner.db) as client:
        yield client
