"""SIGTERM (and SIGINT) in a process's first half second, while Python still imports what the command needs: a
``tether owner`` or ``tether worker`` stops cleanly (exit 0, the database closed), never dies by the signal."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from runtime import kill_and_reap, open_tether_process, tether_command
from runtime._exits import EXIT_OK
from storage_owner.store import is_owned
from tests.conftest import OwnerProcess
from tests.integration._up_helpers import CHILD_ENV, CONSOLE_SCRIPT, ROOT

DELAYS_S = (0.0, 0.05, 0.2, 0.4)


async def _signalled_after(command: list[str], delay_s: float, sig: int, *, as_tether_starts_it: bool) -> int:
    """Start ``command``, send ``sig`` ``delay_s`` after the start, and return its exit status (reaped whatever
    happens). ``as_tether_starts_it``: through :func:`runtime.open_tether_process`, as ``tether up`` starts its
    children; otherwise as a shell would."""
    start = open_tether_process if as_tether_starts_it else trio.lowlevel.open_process
    process = await start(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=CHILD_ENV)
    try:
        await trio.sleep(delay_s)  # the point of the test: a signal this long after the start
        process.send_signal(sig)
        with trio.fail_after(20):
            return await process.wait()
    finally:
        await kill_and_reap(process)


@pytest.mark.parametrize("delay_s", DELAYS_S)
async def test_an_owner_sigtermed_while_starting_stops_cleanly(tmp_path: Path, delay_s: float) -> None:
    db = str(tmp_path / "early.db")
    with trio.fail_after(30):
        status = await _signalled_after(
            tether_command("owner", "--db", db), delay_s, signal.SIGTERM, as_tether_starts_it=True
        )
    assert status == EXIT_OK, f"SIGTERM {delay_s:g} s after the start: exit status {status}"
    assert not is_owned(db)
    assert not os.path.exists(db + "-wal")  # opened or not, the database was left closed


@pytest.mark.parametrize("delay_s", DELAYS_S)
async def test_a_worker_sigtermed_while_starting_stops_cleanly(owner: OwnerProcess, delay_s: float) -> None:
    command = tether_command("worker", "--db", owner.db, "--app", "runtime.demo_app:app")
    with trio.fail_after(30):
        status = await _signalled_after(command, delay_s, signal.SIGTERM, as_tether_starts_it=True)
    assert status == EXIT_OK, f"SIGTERM {delay_s:g} s after the start: exit status {status}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("delay_s", [0.2, 0.4])
async def test_the_console_script_started_by_a_shell_stops_cleanly_on_an_early_signal(
    owner: OwnerProcess, delay_s: float, sig: int
) -> None:
    # Started as a shell starts it: the handler is in place from the first lines the interpreter runs.
    command = [*CONSOLE_SCRIPT, "worker", "--db", owner.db, "--app", "runtime.demo_app:app"]
    with trio.fail_after(30):
        status = await _signalled_after(command, delay_s, sig, as_tether_starts_it=False)
    assert status == EXIT_OK, f"{signal.Signals(sig).name} {delay_s:g} s after the start: exit status {status}"
