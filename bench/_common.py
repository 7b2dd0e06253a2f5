"""What the process benchmarks share: the environment their owner and worker run in, and an owner with one
``tether worker`` serving the steps app (``_steps_app:app``), both stopped gracefully at the end."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Final, NamedTuple

import trio

from protocol import RuntimeInfo
from runtime import stop_gracefully, tether_command, wait_for_owner

HERE: Final = Path(__file__).parent
STEPS_APP: Final = "_steps_app:app"


def bench_env(**extra: str) -> dict[str, str]:
    """This environment with bench/ first on ``PYTHONPATH`` (the benchmarks' apps live there) and ``extra``."""
    pythonpath = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": pythonpath, **extra}


def import_baseline_s(rounds: int = 3) -> float:
    """The baseline of the start-up benchmarks: the median time of a python process importing the project."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import actors, storage_owner.io"], check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


class Served(NamedTuple):
    owner: trio.Process
    worker: trio.Process
    info: RuntimeInfo
    """The owner's runtime file once it listens (its URL and token)."""


@contextlib.asynccontextmanager
async def owner_and_worker(
    db: str, env: dict[str, str], owner_command: Sequence[str] | None = None
) -> AsyncIterator[Served]:
    """An owner on ``db`` (``tether owner --db DB`` unless ``owner_command`` is given) and, once it listens (within
    ``wait_for_owner``'s timeout), one ``tether worker`` serving the steps app; both stopped gracefully when the
    block ends, however it ends."""
    command = list(owner_command) if owner_command is not None else tether_command("owner", "--db", db)
    owner = await trio.lowlevel.open_process(command, stdout=subprocess.DEVNULL, env=env)
    worker: trio.Process | None = None
    try:
        info = await wait_for_owner(db, owner)
        worker = await trio.lowlevel.open_process(
            tether_command("worker", "--db", db, "--app", STEPS_APP), stdout=subprocess.DEVNULL, env=env
        )
        yield Served(owner=owner, worker=worker, info=info)
    finally:
        if worker is not None:
            await stop_gracefully(worker)
        await stop_gracefully(owner)
