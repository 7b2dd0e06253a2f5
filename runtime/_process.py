"""Spawning Tether processes and waiting for them: shared by the CLI, the demo, the tests and the benchmarks."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final

import trio

from protocol import OwnerUnavailable, RuntimeInfo, read_runtime

from ._signals import STOP_SIGNALS

OWNER_START_TIMEOUT_S: Final = 20.0
POLL_INTERVAL_S: Final = 0.01


def tether_command(*args: str) -> list[str]:
    """The command line that runs ``tether ARGS`` with this interpreter (no console script needed).

    ``-P``: the working directory is not put first on the import path, as ``python -m`` would, so that a
    ``runtime.py``, ``protocol.py`` or ``actors.py`` where ``tether up`` runs cannot replace Tether's packages
    (``PYTHONPATH`` is still honoured). The application module is looked up in the working directory all the same,
    by :func:`actors.load_app`.
    """
    return [sys.executable, "-P", "-m", "runtime", *args]


def _block_stop_signals() -> None:
    """In a child between fork and exec: block SIGINT and SIGTERM, which its entry point unblocks."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


async def open_tether_process(command: Sequence[str], **options: Any) -> trio.Process:
    """``trio.lowlevel.open_process(command, **options)`` for a :func:`tether_command`: the child starts with SIGINT
    and SIGTERM blocked, and its entry point unblocks them once its handler remembers them (``runtime._signals``). So
    a signal sent the moment it started stops it cleanly (exit 0) instead of killing it before Python runs."""
    return await trio.lowlevel.open_process(list(command), preexec_fn=_block_stop_signals, **options)


async def start_owner(
    db: str,
    *extra: str,
    stdout: int | None = None,
    stderr: int | None = None,
    timeout_s: float = OWNER_START_TIMEOUT_S,
) -> tuple[trio.Process, RuntimeInfo]:
    """Start ``tether owner --db DB EXTRA...`` and wait until it has published its runtime file.

    Raises :class:`OwnerUnavailable` (with the owner's exit status) if it exits or times out first; the process
    is killed and reaped in that case.
    """
    process = await open_tether_process(tether_command("owner", "--db", db, *extra), stdout=stdout, stderr=stderr)
    try:
        info = await wait_for_owner(db, process, timeout_s=timeout_s)
    except BaseException:
        await kill_and_reap(process)
        raise
    return process, info


async def wait_for_owner(db: str, process: trio.Process, *, timeout_s: float = OWNER_START_TIMEOUT_S) -> RuntimeInfo:
    """Wait until the runtime file of ``db`` names ``process``; a checkpoint.

    Raises :class:`OwnerUnavailable` if the process exits first or ``timeout_s`` passes (the process is left as
    it is: ``process.returncode`` tells which happened).
    """
    with trio.move_on_after(timeout_s):
        while True:
            if process.poll() is not None:
                raise OwnerUnavailable(f"the owner for {db} exited with status {process.returncode} before listening")
            try:
                info = read_runtime(db)
            except OwnerUnavailable:
                info = None
            if info is not None and info.pid == process.pid:
                return info
            await trio.sleep(POLL_INTERVAL_S)
    raise OwnerUnavailable(f"the owner for {db} did not start listening within {timeout_s:g} s")


async def kill_and_reap(process: trio.Process, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` (if still running) and wait for the exit status. Shielded: reaping always completes."""
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)
        with trio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
        status = await process.wait()
    return status


async def stop_gracefully(
    process: trio.Process, *, timeout_s: float = 10.0, on_kill: Callable[[], object] | None = None
) -> int:
    """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit status. Shielded: reaping always completes.

    ``on_kill`` is called, if given, when the process outlived ``timeout_s`` and is about to be killed.
    """
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        with trio.move_on_after(timeout_s):
            await process.wait()
        if process.returncode is None and on_kill is not None:
            on_kill()
        status = await kill_and_reap(process)
    return status
