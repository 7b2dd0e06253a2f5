"""The supervisor's warm standby: once the owner listens, ``tether up`` keeps the next owner started and waiting for
the ownership lock; a SIGKILLed owner is replaced by that very process (no new process start on the path from the
kill to the first answer), a new standby is started behind it, and a stop leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

import actors
from protocol import read_runtime
from runtime import kill_and_reap, tether_command
from runtime._exits import EXIT_OK
from runtime._supervisor import read_state
from storage_owner.store import is_owned, lock_path
from tests.conftest import OwnerProcess
from tests.integration._up_helpers import (
    cpu_used_s,
    lock_has_waiter,
    pid_gone,
    run_tether,
    tether_up,
    thread_cpu_ns,
    wait_for,
    wait_gone,
)

STANDBY_IDLE_S = 2.0


async def _state_where(db: str, predicate: Any, what: str, *, timeout_s: float = 30.0) -> dict[str, Any]:
    with trio.move_on_after(timeout_s):
        while True:
            state = read_state(db)
            if state is not None and predicate(state):
                return state
            await trio.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout_s:g} s; last state: {read_state(db)}")


def _standby_waiting(state: dict[str, Any]) -> bool:
    pid = state["standby"]["pid"]
    return pid is not None and not pid_gone(pid) and state["owner"]["pid"] not in (None, pid)


async def test_a_killed_owner_is_replaced_by_the_standby_and_a_new_standby_follows(
    db_path: str, tmp_path: Path
) -> None:
    with trio.fail_after(120):
        async with tether_up(db_path, tmp_path, "--workers", "0") as up:
            before = await _state_where(db_path, _standby_waiting, "owner with a standby")
            up.record(None)
            old_owner, standby = before["owner"]["pid"], before["standby"]["pid"]
            # tether status names the standby, beside the owner.
            as_json = await run_tether("status", "--db", db_path, "--json")
            assert as_json.returncode == EXIT_OK, as_json.stderr
            printed = json.loads(as_json.stdout)
            assert printed["owner"]["pid"] == old_owner
            assert printed["standby"] == {"pid": standby, "alive": True}
            human = await run_tether("status", "--db", db_path)
            assert human.returncode == EXIT_OK, human.stderr
            assert f"pid {standby}" in human.stdout.decode()
            async with actors.connect(db=db_path) as client:
                conversation_id = await client.create_conversation()
                first = await client.append(conversation_id, kind="test.n", data=1)
                os.kill(old_owner, signal.SIGKILL)
                assert not await wait_gone({old_owner}, timeout_s=10)
                # The next answer comes from the standby, which took the lock the kernel released. The client may
                # send it before it saw the old connection close: then it fails ConnectionLost, unapplied (the owner
                # was dead), and is sent again with the same entry id, as docs/protocol.md says a retry is made.
                entry_id = actors.new_id()
                try:
                    second = await client.append(conversation_id, kind="test.n", data=2, entry_id=entry_id)
                except actors.ConnectionLost:
                    second = await client.append(conversation_id, kind="test.n", data=2, entry_id=entry_id)
                after = await _state_where(
                    db_path,
                    lambda state: state["owner"]["pid"] == standby and _standby_waiting(state),
                    "the standby as the owner, with a new standby",
                )
                up.record(None)
                entries = await client.entries(conversation_id)
            assert after["owner"]["restarts"] == 1
            assert after["standby"]["pid"] not in (old_owner, standby)
            assert second > first
            assert [entry.data for entry in entries] == [1, 2]
            up.process.send_signal(signal.SIGTERM)
            assert await up.wait_exit() == EXIT_OK, up.stderr_text()
            up.pids.add(after["standby"]["pid"])
            await up.assert_everything_gone(timeout_s=1)


async def _blocked_standby(db: str) -> trio.Process:
    """``tether owner --standby`` on ``db`` (whose owner runs), once it waits in ``flock`` for the ownership lock."""
    process = await trio.lowlevel.open_process(
        tether_command("owner", "--db", db, "--standby"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        await wait_for(
            lambda: process.poll() is not None or lock_has_waiter(lock_path(db)), "standby waiting for the lock"
        )
    except BaseException:
        await kill_and_reap(process)
        raise
    assert process.returncode is None, f"the standby exited with status {process.returncode}"
    return process


async def test_a_waiting_standby_uses_no_cpu_and_stops_at_once_on_sigterm(owner: OwnerProcess) -> None:
    with trio.fail_after(60):
        standby = await _blocked_standby(owner.db)
        try:
            before = thread_cpu_ns(standby.pid)
            await trio.sleep(STANDBY_IDLE_S)  # the measurement window: what a waiting standby uses
            used_s = cpu_used_s(before, thread_cpu_ns(standby.pid))
            print(f"a waiting standby used {used_s * 1000:.2f} ms of CPU in {STANDBY_IDLE_S:g} s")
            assert used_s < 0.005  # nothing polls the lock: under a quarter of a percent of a core
            stopped_at = time.monotonic()
            standby.send_signal(signal.SIGTERM)
            with trio.fail_after(5):
                status = await standby.wait()
            print(f"SIGTERM -> the waiting standby exited in {time.monotonic() - stopped_at:.3f} s")
            assert status == EXIT_OK
        finally:
            await kill_and_reap(standby)
        # The owner kept its database: the abandoned wait took nothing from it, and it answers.
        assert is_owned(owner.db) and read_runtime(owner.db).pid == owner.pid
        async with actors.connect(db=owner.db) as client:
            await client.ping()
        await owner.kill()
        assert not is_owned(owner.db)  # nobody took the lock the kill freed: the stopped standby let go of it


async def test_a_waiting_standby_takes_over_within_milliseconds_of_the_owners_sigkill(owner: OwnerProcess) -> None:
    with trio.fail_after(60):
        standby = await _blocked_standby(owner.db)
        try:
            killed_at = time.monotonic()
            await owner.kill()
            await wait_for(
                lambda: is_owned(owner.db) and read_runtime(owner.db).pid == standby.pid, "the standby listening"
            )
            listening_s = time.monotonic() - killed_at
            print(f"owner SIGKILL -> the standby listening after {listening_s * 1000:.1f} ms")
            async with actors.connect(db=owner.db) as client:
                await client.ping()
            assert listening_s < 2.0  # opening the database and listening: no process start, no polling delay
            standby.send_signal(signal.SIGTERM)
            with trio.fail_after(10):
                assert await standby.wait() == EXIT_OK
        finally:
            await kill_and_reap(standby)
