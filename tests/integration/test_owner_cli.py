"""``tether owner`` as a process: runtime file, single ownership, takeover after SIGKILL, clean stops, schema
refusal, help and usage errors."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import apsw
import attrs
import pytest
import trio

import actors
from protocol import read_runtime, runtime_path, write_private_json
from runtime import tether_command
from runtime._exits import (
    EXIT_ALREADY_RUNNING,
    EXIT_FAILED,
    EXIT_NOT_TETHER_DATABASE,
    EXIT_OK,
    EXIT_SCHEMA_TOO_NEW,
    EXIT_USAGE,
)
from storage_owner.store import APPLICATION_ID, SCHEMA_VERSION
from tests.conftest import OwnerProcess


async def run_tether(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``tether ARGS`` to completion and capture its output."""
    return await trio.run_process(tether_command(*args), capture_stdout=True, capture_stderr=True, check=False)


def make_foreign_database(path: str, user_version: int) -> None:
    """A SQLite database that Tether did not write: a table of its own, and ``user_version`` as given."""
    db = apsw.Connection(path)
    db.execute("CREATE TABLE other_things (x INTEGER)")
    db.execute(f"PRAGMA user_version={user_version}")
    db.close()


def stderr_lines(result: subprocess.CompletedProcess[bytes]) -> list[str]:
    return [line for line in result.stderr.decode(errors="replace").splitlines() if line.strip()]


async def test_runtime_file_is_private_and_names_the_owner(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        path = runtime_path(owner.db)
        mode = stat.S_IMODE(path.stat().st_mode)
        raw = json.loads(path.read_text(encoding="utf-8"))
        async with actors.connect(url=raw["url"], token=raw["token"]) as client:
            pong = await client.ping()
    assert mode == 0o600
    assert raw["pid"] == owner.pid
    assert raw["url"].startswith("ws://127.0.0.1:")
    assert isinstance(raw["token"], str) and len(raw["token"]) >= 32
    assert pong.head_seq == 0


async def test_second_owner_exits_at_once_naming_the_holder(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        before = runtime_path(owner.db).read_bytes()
        started = time.monotonic()
        result = await run_tether("owner", "--db", owner.db)
        elapsed = time.monotonic() - started
        async with actors.connect(db=owner.db) as client:
            await client.ping()
    assert result.returncode == EXIT_ALREADY_RUNNING
    assert elapsed < 10
    lines = stderr_lines(result)
    assert len(lines) == 1, lines
    assert f"pid {owner.pid}" in lines[0]
    assert runtime_path(owner.db).read_bytes() == before, "the refused owner must not touch the runtime file"
    assert owner.process is not None and owner.process.returncode is None


async def test_new_owner_takes_over_after_sigkill(db_path: str) -> None:
    first = OwnerProcess(db_path)
    second = OwnerProcess(db_path)
    try:
        with trio.fail_after(30):
            first_info = await first.start()
            async with actors.connect(db=db_path) as client:
                conversation_id = await client.create_conversation()
                seq = await client.append(conversation_id, kind="app.note", data="before the kill")
            assert await first.kill() == -signal.SIGKILL
            # The killed owner could not remove its file: it is left behind, naming a dead pid.
            assert read_runtime(db_path).pid == first_info.pid

            second_info = await second.start()
            assert read_runtime(db_path) == second_info
            assert stat.S_IMODE(runtime_path(db_path).stat().st_mode) == 0o600
            async with actors.connect(db=db_path) as client:
                entries = await client.entries(conversation_id)
    finally:
        await first.close()
        await second.close()
    assert second_info.pid == second.pid != first_info.pid
    assert second_info.instance != first_info.instance
    assert second_info.token != first_info.token
    assert [(entry.seq, entry.data) for entry in entries] == [(seq, "before the kill")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signal_stops_cleanly_and_removes_the_runtime_file(db_path: str, sig: signal.Signals) -> None:
    process = OwnerProcess(db_path)
    try:
        with trio.fail_after(20):
            await process.start()
            assert runtime_path(db_path).exists()
            assert process.process is not None
            process.process.send_signal(sig)
            status = await process.wait()
    finally:
        await process.close()
    assert status == EXIT_OK
    assert not runtime_path(db_path).exists()


async def test_schema_too_new_is_refused_and_left_untouched(db_path: str) -> None:
    newer = SCHEMA_VERSION + 1
    make_foreign_database(db_path, newer)
    db = apsw.Connection(db_path)
    db.execute(f"PRAGMA application_id={APPLICATION_ID}")  # a newer Tether marks its databases too
    db.close()
    before = Path(db_path).read_bytes()
    with trio.fail_after(20):
        result = await run_tether("owner", "--db", db_path)
    assert result.returncode == EXIT_SCHEMA_TOO_NEW
    lines = stderr_lines(result)
    assert len(lines) == 1, lines
    assert str(newer) in lines[0] and str(SCHEMA_VERSION) in lines[0]
    assert os.path.abspath(db_path) in lines[0] or db_path in lines[0]
    assert Path(db_path).read_bytes() == before
    assert not Path(db_path + "-wal").exists()
    assert not runtime_path(db_path).exists()


@pytest.mark.parametrize("args", [("--help",), ("owner", "--help"), ("demo", "--help")])
async def test_help_exits_zero(args: tuple[str, ...]) -> None:
    with trio.fail_after(20):
        result = await run_tether(*args)
    assert result.returncode == EXIT_OK
    assert b"usage:" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("nonsense",),
        ("owner",),
        ("owner", "--db", "x.db", "--bogus"),
        ("owner", "--db", "x.db", "--listen", "no-port"),
        ("owner", "--db", "x.db", "--clock", "sundial"),
        ("owner", "--db", "x.db", "--sync", "sometimes"),
        ("owner", "--db", "x.db", "--fault-kill-before-commit", "0"),
        ("owner", "--db", "x.db", "--fault-kill-after-commit", "-3"),
        ("demo", "--entries", "0"),
    ],
)
async def test_bad_flags_exit_two(args: tuple[str, ...], tmp_path: Path) -> None:
    with trio.fail_after(20):
        result = await trio.run_process(
            tether_command(*args), capture_stdout=True, capture_stderr=True, check=False, cwd=tmp_path
        )
    assert result.returncode == EXIT_USAGE
    assert list(tmp_path.iterdir()) == [], "a usage error must not create anything"


@pytest.mark.parametrize("problem", ["missing-directory", "address-in-use"])
async def test_startup_os_errors_fail_with_one_line(owner: OwnerProcess, tmp_path: Path, problem: str) -> None:
    assert owner.info is not None
    if problem == "missing-directory":
        args = ("owner", "--db", str(tmp_path / "no" / "such" / "dir" / "t.db"))
        named = str(tmp_path / "no" / "such" / "dir")
    else:
        port = owner.info.url.rsplit(":", 1)[1]
        args = ("owner", "--db", str(tmp_path / "other.db"), "--listen", f"127.0.0.1:{port}")
        named = port
    with trio.fail_after(20):
        result = await run_tether(*args)
    assert result.returncode == EXIT_FAILED
    lines = stderr_lines(result)
    assert len(lines) == 1, lines
    assert named in lines[0]
    if problem == "address-in-use":
        # The address is bound before the database is opened: nothing was created.
        assert not (tmp_path / "other.db").exists()


async def test_full_sync_owner_keeps_acknowledged_writes_across_sigkill(db_path: str) -> None:
    process = OwnerProcess(db_path, "--sync", "full")
    try:
        with trio.fail_after(30):
            await process.start()
            async with actors.connect(db=db_path) as client:
                conversation_id = await client.create_conversation()
                seq = await client.append(conversation_id, kind="app.note", data="synced")
            assert await process.kill() == -signal.SIGKILL
            await process.start()
            async with actors.connect(db=db_path) as client:
                entries = await client.entries(conversation_id)
    finally:
        await process.close()
    assert [(entry.seq, entry.data) for entry in entries] == [(seq, "synced")]


async def test_demo_exits_zero_even_when_a_writer_starts_late(tmp_path: Path) -> None:
    # With 2 entries per writer the first writer reaches the kill point before the second has connected.
    for attempt in range(3):
        db = str(tmp_path / f"demo-{attempt}.db")
        with trio.fail_after(60):
            result = await trio.run_process(
                tether_command("demo", "--db", db, "--part", "commits", "--entries", "2"),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                cwd=tmp_path,
            )
        assert result.returncode == EXIT_OK, result.stderr.decode(errors="replace")
        assert not runtime_path(db).exists(), "the demo must stop its owner cleanly"


@pytest.mark.parametrize("command", ["status", "tasks"])
async def test_status_and_tasks_fail_when_the_owner_refuses_the_token(owner: OwnerProcess, command: str) -> None:
    # The runtime file names the running owner but with a token it does not accept: the owner must not look idle.
    assert owner.info is not None
    write_private_json(runtime_path(owner.db), attrs.asdict(attrs.evolve(owner.info, token="not-the-token")))
    with trio.fail_after(20):
        result = await run_tether(command, "--db", owner.db)
    assert result.returncode == EXIT_FAILED
    assert result.stdout == b""
    assert len(stderr_lines(result)) == 1, stderr_lines(result)


@pytest.mark.parametrize(
    ("content", "exit_status"),
    [
        ("not-sqlite", EXIT_NOT_TETHER_DATABASE),
        ("another-app", EXIT_NOT_TETHER_DATABASE),
        ("newer-schema", EXIT_NOT_TETHER_DATABASE),  # another application's tables, whatever its user_version
    ],
)
async def test_tasks_on_a_file_that_is_not_a_tether_database_fails_with_one_line(
    db_path: str, content: str, exit_status: int
) -> None:
    if content == "not-sqlite":
        Path(db_path).write_bytes(b"a text file, not a database\n" * 64)
    else:
        make_foreign_database(db_path, SCHEMA_VERSION + 1 if content == "newer-schema" else SCHEMA_VERSION)
    before = Path(db_path).read_bytes()
    with trio.fail_after(20):
        result = await run_tether("tasks", "--db", db_path)
    assert result.returncode == exit_status
    assert result.stdout == b""
    assert len(stderr_lines(result)) == 1, stderr_lines(result)
    assert Path(db_path).read_bytes() == before
