"""Fixtures shared by every test: temporary databases, real owner processes (the test kit's, ``actors.testing``),
and the guard that fails a test which leaves a process of its own behind."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from actors.testing import ScratchOwner

# The test kit's fixtures (tether_db, tether_owner, tether_client) where the plugin's entry point is not installed.
pytest_plugins = ("actors.testing.plugin",)

# CI explores the same examples every run (a failure there must be reproducible, and a rare one must not block a
# landing at random); developers' runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def _children(pid: int) -> set[int]:
    """Live (non-zombie) processes whose parent is ``pid``, read from /proc."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, parent = fields[0], int(fields[1])
        if parent == pid and state != "Z":
            found.add(int(entry))
    return found


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Fail the test if a child process it started is still alive once it (and its fixtures) finished."""
    before = _children(os.getpid())
    yield
    left = _children(os.getpid()) - before
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    assert not left, f"the test left processes running: {sorted(left)}"


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "tether.db")


class OwnerProcess(ScratchOwner):
    """A real ``tether owner`` process on a test database (the kit's :class:`~actors.testing.ScratchOwner`, on the
    wall clock unless ``args`` say ``--clock manual``: a later ``--clock`` wins); restartable, killable, always
    reaped."""

    def __init__(self, db: str, *args: str) -> None:
        super().__init__(db, *args, clock="wall")


@pytest.fixture
async def owner(db_path: str) -> AsyncIterator[OwnerProcess]:
    """A started owner (wall clock) on ``db_path``; stopped and reaped after the test."""
    process = OwnerProcess(db_path)
    await process.start()
    try:
        yield process
    finally:
        await process.close()


@pytest.fixture
async def manual_owner(db_path: str) -> AsyncIterator[OwnerProcess]:
    """A started owner on a manual clock."""
    process = OwnerProcess(db_path, "--clock", "manual")
    await process.start()
    try:
        yield process
    finally:
        await process.close()
