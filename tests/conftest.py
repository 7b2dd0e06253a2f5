"""Fixtures shared by every test: temporary databases, real owner processes, and the guard that fails a test
which leaves a process of its own behind."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
from hypothesis import settings

from protocol import RuntimeInfo
from runtime import kill_and_reap, start_owner, stop_gracefully

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


class OwnerProcess:
    """A real ``tether owner`` process on a test database; restartable, killable, always reaped."""

    def __init__(self, db: str, *args: str) -> None:
        self.db = db
        self.args = args
        self.process: trio.Process | None = None
        self.info: RuntimeInfo | None = None

    async def start(self, *extra: str) -> RuntimeInfo:
        assert self.process is None or self.process.returncode is not None, "owner already running"
        self.process, self.info = await start_owner(
            self.db, *self.args, *extra, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        return self.info

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def kill(self) -> int:
        assert self.process is not None
        return await kill_and_reap(self.process, signal.SIGKILL)

    async def stop(self) -> int:
        assert self.process is not None
        return await stop_gracefully(self.process)

    async def wait(self) -> int:
        assert self.process is not None
        return await self.process.wait()

    async def stderr_text(self) -> str:
        assert self.process is not None and self.process.stderr is not None
        chunks = []
        with trio.move_on_after(2):
            while chunk := await self.process.stderr.receive_some(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            await stop_gracefully(self.process)


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
