"""The supervisor's warm standby: once the owner listens, ``tether up`` keeps the next owner started and waiting for
the ownership lock; a SIGKILLed owner is replaced by that very process (no new process start on the path from the
kill to the first answer), a new standby is started behind it, and a stop leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import trio

import actors
from runtime._cli import EXIT_OK
from runtime._supervisor import read_state
from tests.integration._up_helpers import pid_gone, run_tether, tether_up, wait_gone


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
                # The next answer comes from the standby, which took the lock the kernel released.
                second = await client.append(conversation_id, kind="test.n", data=2)
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
