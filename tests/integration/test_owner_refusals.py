"""Databases the owner must not serve, as processes: another application's file, an empty file, a damaged one and
a newer one are refused with their own exit status and left byte for byte as they were, by ``tether owner`` and by
``tether up`` (which stops at once, before starting any worker); ``tether check`` runs the full check beside a live
owner; a symbolic link planted where the owner creates its files is refused; the owner and the workers stop on
SIGTERM even before they were ready."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
from pathlib import Path

import apsw
import pytest
import trio

import actors
from protocol import runtime_path
from runtime import kill_and_reap, stop_gracefully, tether_command
from runtime._exits import (
    EXIT_DATABASE_DAMAGED,
    EXIT_FAILED,
    EXIT_NOT_TETHER_DATABASE,
    EXIT_OK,
    EXIT_SCHEMA_TOO_NEW,
)
from storage_owner.store import APPLICATION_ID, SCHEMA_VERSION
from tests.conftest import OwnerProcess
from tests.integration._up_helpers import CHILD_ENV, ROOT, processes_naming, run_tether, wait_gone

MARKER_APP = "tests.integration._marker_app:app"
PAGE_BYTES = 4096


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _files_beside(db: str) -> list[str]:
    """The files in the database's directory, lock files included (none is created beside a file refused)."""
    return sorted(os.listdir(os.path.dirname(db)))


def _stderr_lines(result: subprocess.CompletedProcess[bytes]) -> list[str]:
    return [line for line in result.stderr.decode(errors="replace").splitlines() if line.strip()]


async def _tether_database(db: str, entries: int = 400) -> None:
    """A real Tether database written by a real owner, stopped cleanly."""
    owner = OwnerProcess(db)
    try:
        await owner.start()
        async with actors.connect(db=db) as client:
            conversation_id = await client.create_conversation()
            for start in range(0, entries, 50):
                async with client.commit() as tx:
                    for n in range(start, start + 50):
                        tx.append(conversation_id, kind="test.n", data={"n": n, "text": "x" * 200})
        assert await owner.stop() == EXIT_OK
    finally:
        await owner.close()


def _damage_entries_root(db: str) -> None:
    """Overwrite the root page of the entries table with random bytes (seeded)."""
    with open(db, "rb") as stream:
        header = stream.read(100)
    assert int.from_bytes(header[16:18], "big") == PAGE_BYTES
    connection = apsw.Connection(db, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        root = int(connection.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'entries'").fetchone()[0])  # type: ignore[index]
    finally:
        connection.close()
    for suffix in ("-wal", "-shm"):  # the read-only connection's (empty) files: the owner had checkpointed all
        Path(db + suffix).unlink(missing_ok=True)
    with open(db, "r+b") as stream:
        stream.seek((root - 1) * PAGE_BYTES)
        stream.write(random.Random(7).randbytes(PAGE_BYTES))


async def _make(kind: str, db: str) -> None:
    if kind == "foreign":
        connection = apsw.Connection(db)
        connection.execute("CREATE TABLE invoices (n INTEGER); INSERT INTO invoices VALUES (1);")
        connection.close()
    elif kind == "empty":
        Path(db).write_bytes(b"")
    elif kind == "damaged":
        await _tether_database(db)
        _damage_entries_root(db)
    else:
        assert kind == "newer"
        connection = apsw.Connection(db)
        connection.execute(f"PRAGMA application_id={APPLICATION_ID}; PRAGMA user_version={SCHEMA_VERSION + 1}")
        connection.execute("CREATE TABLE owner (singleton INTEGER)")
        connection.close()


REFUSALS = [
    ("foreign", EXIT_NOT_TETHER_DATABASE),
    ("empty", EXIT_NOT_TETHER_DATABASE),
    ("damaged", EXIT_DATABASE_DAMAGED),
    ("newer", EXIT_SCHEMA_TOO_NEW),
]


@pytest.mark.parametrize(("kind", "status"), REFUSALS)
async def test_owner_refuses_a_database_it_must_not_serve_and_leaves_it_untouched(
    db_path: str, kind: str, status: int
) -> None:
    with trio.fail_after(60):
        await _make(kind, db_path)
        before = (_digest(db_path), _files_beside(db_path))
        result = await run_tether("owner", "--db", db_path)
    assert result.returncode == status, result.stderr
    lines = _stderr_lines(result)
    assert len(lines) == 1, lines
    assert db_path in lines[0]
    assert (_digest(db_path), _files_beside(db_path)) == before
    assert not runtime_path(db_path).exists()


@pytest.mark.parametrize(("kind", "status"), REFUSALS)
async def test_up_stops_at_once_with_the_owners_status_and_never_starts_a_worker(
    db_path: str, tmp_path: Path, kind: str, status: int
) -> None:
    imports = tmp_path / "imports"
    with trio.fail_after(90):
        await _make(kind, db_path)
        digest = _digest(db_path)
        files = _files_beside(db_path)
        env = {**CHILD_ENV, "TETHER_TEST_IMPORTS": str(imports)}
        process = await trio.lowlevel.open_process(
            tether_command("up", "--db", db_path, "--app", MARKER_APP, "--workers", "2"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=env,
        )
        try:
            assert process.stderr is not None
            chunks = []
            while chunk := await process.stderr.receive_some(65536):
                chunks.append(chunk)
            returncode = await process.wait()
        finally:
            await kill_and_reap(process)
        assert not await wait_gone(set(), db_path)
    stderr = b"".join(chunks).decode(errors="replace")
    assert returncode == status, stderr
    # The app may have been loaded once, by tether up's check before the owner's start; no worker was started.
    loaded = imports.read_text().split() if imports.exists() else []
    assert "worker" not in loaded, f"workers were started: {loaded}"
    assert _digest(db_path) == digest
    if kind in ("foreign", "empty", "newer"):  # refused before anything was created beside it, the app not even loaded
        assert (_files_beside(db_path), loaded) == (files, [])


SOME_ID = "0190f3a2-7c4e-7b1a-9d3e-5f6a7b8c9d0e"
"""A well-formed id naming nothing: a malformed one is refused (exit 2) before the database is looked at."""
READING_COMMANDS = [
    "runs",
    "tasks",
    "watch",
    "interactions",
    f"abort {SOME_ID}",
    f"cancel {SOME_ID}",
    "submit --agent a hi",
]


@pytest.mark.parametrize(
    ("command", "kind"),
    [("status", "text"), ("status", "foreign"), ("status", "empty"), *((c, "text") for c in READING_COMMANDS)],
)
async def test_a_command_that_reads_a_file_that_is_not_a_tether_database_says_so_and_exits_5(
    db_path: str, command: str, kind: str
) -> None:
    with trio.fail_after(30):
        if kind == "text":
            Path(db_path).write_text("hello\n")
        else:
            await _make(kind, db_path)
        before = (_digest(db_path), _files_beside(db_path))
        result = await run_tether(*command.split(), "--db", db_path)
    assert result.returncode == EXIT_NOT_TETHER_DATABASE, result.stderr
    assert result.stdout == b""
    (line,) = _stderr_lines(result)
    assert f"{db_path} is not a Tether database" in line and "tether owner" not in line
    assert (_digest(db_path), _files_beside(db_path)) == before


async def test_check_runs_beside_a_live_owner_and_reports_a_damaged_page(owner: OwnerProcess, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with actors.connect(db=owner.db) as client:
            conversation_id = await client.create_conversation()
            await client.append(conversation_id, kind="test.n", data=1)
            result = await run_tether("check", "--db", owner.db, "--json")
            assert result.returncode == EXIT_OK, result.stderr
            report = json.loads(result.stdout)
            assert report["ok"] and report["problems"] == [] and report["schema_version"] == SCHEMA_VERSION
            assert await client.append(conversation_id, kind="test.n", data=2) > 0  # the owner serves on
        damaged = str(tmp_path / "damaged.db")
        await _tether_database(damaged)
        _damage_entries_root(damaged)
        digest = _digest(damaged)
        result = await run_tether("check", "--db", damaged, "--json")
        plain = await run_tether("check", "--db", damaged)
    assert result.returncode == EXIT_FAILED
    report = json.loads(result.stdout)
    assert not report["ok"] and report["problems"]
    assert plain.returncode == EXIT_FAILED and len(_stderr_lines(plain)) == 1
    assert _digest(damaged) == digest


@pytest.mark.parametrize("kind", ["foreign", "empty"])
async def test_check_of_a_file_that_is_not_a_tether_database_exits_5(db_path: str, kind: str) -> None:
    with trio.fail_after(30):
        await _make(kind, db_path)
        digest = _digest(db_path)
        result = await run_tether("check", "--db", db_path)
        as_json = await run_tether("check", "--db", db_path, "--json")
    assert result.returncode == EXIT_NOT_TETHER_DATABASE
    (line,) = _stderr_lines(result)
    assert "not a Tether database" in line and "tether check" in line and "create a new one" not in line
    assert as_json.returncode == EXIT_NOT_TETHER_DATABASE  # the same status, and one JSON object on stdout
    report = json.loads(as_json.stdout)
    assert report["db"] == os.path.abspath(db_path) and report["ok"] is False
    (problem,) = report["problems"]
    assert "not a Tether database" in problem and "create a new one" not in problem
    assert report["schema_version"] is None and report["application_id"] is None and report["pages"] is None
    assert _digest(db_path) == digest


async def test_check_of_a_missing_file_prints_json_too_and_creates_nothing(db_path: str) -> None:
    with trio.fail_after(30):
        as_json = await run_tether("check", "--db", db_path, "--json")
        plain = await run_tether("check", "--db", db_path)
    assert as_json.returncode == EXIT_FAILED and plain.returncode == EXIT_FAILED
    report = json.loads(as_json.stdout)
    assert report["db"] == os.path.abspath(db_path) and report["ok"] is False
    (problem,) = report["problems"]
    assert "does not exist" in problem
    assert "does not exist" in _stderr_lines(plain)[0] and not plain.stdout
    assert not os.path.lexists(db_path)


@pytest.mark.parametrize("planted", ["lock", "runtime-temporary"])
async def test_a_symlink_planted_where_the_owner_writes_is_refused(db_path: str, tmp_path: Path, planted: str) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"precious")
    process = OwnerProcess(db_path)
    if planted == "lock":
        os.symlink(target, db_path + ".lock")
    with trio.fail_after(60):
        if planted == "lock":
            result = await run_tether("owner", "--db", db_path)
        else:
            # The owner writes DB.runtime.json through DB.runtime.json.<its pid>.tmp: start it stopped, plant the
            # link at its temporary name, then let it run.
            owner = await trio.lowlevel.open_process(
                ["/bin/sh", "-c", 'kill -STOP $$; exec "$@"', "sh", *tether_command("owner", "--db", db_path)],
                stderr=subprocess.PIPE,
            )
            try:
                for _ in range(2000):  # until the shell stopped itself
                    if _proc_state(owner.pid) == "T":
                        break
                    await trio.sleep(0.01)
                os.symlink(target, f"{db_path}.runtime.json.{owner.pid}.tmp")
                owner.send_signal(signal.SIGCONT)
                assert owner.stderr is not None
                chunks = []
                while chunk := await owner.stderr.receive_some(65536):
                    chunks.append(chunk)
                result = subprocess.CompletedProcess([], await owner.wait(), b"", b"".join(chunks))
            finally:
                await stop_gracefully(owner)
    await process.close()
    assert result.returncode == EXIT_FAILED, result.stderr
    assert "symbolic link" in result.stderr.decode()
    assert target.read_bytes() == b"precious"
    assert not runtime_path(db_path).exists()


def _proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


async def test_a_worker_waiting_for_its_owner_stops_on_sigterm(db_path: str, tmp_path: Path) -> None:
    imports = tmp_path / "imports"
    with trio.fail_after(60):
        worker = await trio.lowlevel.open_process(
            tether_command("worker", "--db", db_path, "--app", MARKER_APP),
            cwd=ROOT,
            env={**CHILD_ENV, "TETHER_TEST_IMPORTS": str(imports)},
        )
        try:
            for _ in range(3000):  # until it loaded the app; it then waits for an owner that never comes
                if imports.exists() and imports.read_text().strip():
                    break
                await trio.sleep(0.01)
            # At once: a signal that comes before trio's handlers are in place is remembered and acted on then
            # (runtime._signals), so no moment of the start is unsafe.
            assert worker.returncode is None
            worker.send_signal(signal.SIGTERM)
            with trio.move_on_after(15):
                await worker.wait()
            status = worker.returncode
        finally:
            await kill_and_reap(worker)
    assert status == EXIT_OK
    assert not processes_naming(db_path)


async def test_start_check_0_skips_the_check_and_serves_what_the_operator_chose_to_serve(db_path: str) -> None:
    with trio.fail_after(60):
        await _make("damaged", db_path)
        owner = OwnerProcess(db_path, "--start-check", "0")
        try:
            info = await owner.start()  # listens: the damaged page is only met when something reads it
            assert info.pid == owner.pid
            assert await owner.stop() == EXIT_OK
        finally:
            await owner.close()
        result = await run_tether("owner", "--db", db_path, "--start-check", "2")
    assert result.returncode == EXIT_DATABASE_DAMAGED
