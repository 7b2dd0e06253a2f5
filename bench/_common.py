"""What the process benchmarks share: the environment their owner and worker run in, an owner with one
``tether worker`` serving a bench app (the steps app, ``_steps_app:app``, unless told), both stopped gracefully at
the end, and the owner's cost read around a measured window: its process CPU from ``/proc`` and, when it runs under
the bench-only launcher ``_steps_owner.py``, its batch totals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import apsw
import trio

from protocol import RuntimeInfo
from runtime import stop_gracefully, tether_command, wait_for_owner

HERE: Final = Path(__file__).parent
STEPS_APP: Final = "_steps_app:app"
PROFILED_OWNER: Final = HERE / "_steps_owner.py"


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
    db: str, env: dict[str, str], owner_command: Sequence[str] | None = None, app: str = STEPS_APP
) -> AsyncIterator[Served]:
    """An owner on ``db`` (``tether owner --db DB`` unless ``owner_command`` is given) and, once it listens (within
    ``wait_for_owner``'s timeout), one ``tether worker`` serving ``app`` (the steps app by default); both stopped
    gracefully when the block ends, however it ends."""
    command = list(owner_command) if owner_command is not None else tether_command("owner", "--db", db)
    owner = await trio.lowlevel.open_process(command, stdout=subprocess.DEVNULL, env=env)
    worker: trio.Process | None = None
    try:
        info = await wait_for_owner(db, owner)
        worker = await trio.lowlevel.open_process(
            tether_command("worker", "--db", db, "--app", app), stdout=subprocess.DEVNULL, env=env
        )
        yield Served(owner=owner, worker=worker, info=info)
    finally:
        if worker is not None:
            await stop_gracefully(worker)
        await stop_gracefully(owner)


def profiled_owner_command(db: str, stats_path: Path, sync: str) -> list[str]:
    """``tether owner --db DB --sync SYNC`` under the bench-only launcher, which dumps its batch totals to
    ``stats_path`` on SIGUSR1 (:func:`owner_stats`)."""
    return [sys.executable, str(PROFILED_OWNER), str(stats_path), "owner", "--db", db, "--sync", sync]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def owner_stats(owner: trio.Process, path: Path) -> dict[str, float]:
    """Ask the profiled owner for its batch totals (SIGUSR1) and read them."""
    asked = time.time()
    owner.send_signal(signal.SIGUSR1)
    with trio.fail_after(5):
        while True:
            if path.exists():
                stats: dict[str, float] = json.loads(path.read_text())
                if stats["dumped_at"] >= asked:
                    return stats
            await trio.sleep(0.01)


def commit_seq(db: str) -> int:
    """The commit log's last sequence number, read on a connection of our own (WAL: beside the owner's writes)."""
    connection = apsw.Connection(db, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = connection.execute("SELECT coalesce(max(seq), 0) FROM commits").fetchone()
    finally:
        connection.close()
    assert row is not None
    return int(row[0])


class Snapshot(NamedTuple):
    """The owner's and the worker's totals at one moment (:func:`snapshot`)."""

    owner_cpu_s: float
    worker_cpu_s: float
    stats: dict[str, Any]


async def snapshot(served: Served, stats_path: Path, *, ending: bool = False) -> Snapshot:
    """The profiled owner's batch totals and both processes' CPU so far; the CPU read after the dump at the start
    of a window and before it at its end (``ending``), so the dumps' own CPU stays out of the window."""
    if ending:
        owner, worker = cpu_s(served.owner.pid), cpu_s(served.worker.pid)
        return Snapshot(owner, worker, await owner_stats(served.owner, stats_path))
    stats = await owner_stats(served.owner, stats_path)
    return Snapshot(cpu_s(served.owner.pid), cpu_s(served.worker.pid), stats)


def per_step(before: Snapshot, after: Snapshot, steps: int) -> dict[str, float]:
    """What the owner (and the worker) spent per step between two snapshots: process CPU, the time inside the
    owner's batches (wall and CPU), in its core alone, its batches, and the SQL statements it ran."""

    def delta(key: str) -> float:
        return float(after.stats.get(key, 0.0)) - float(before.stats.get(key, 0.0))

    return {
        "steps": steps,
        "owner_cpu_us_per_step": (after.owner_cpu_s - before.owner_cpu_s) / steps * 1e6,
        "worker_cpu_us_per_step": (after.worker_cpu_s - before.worker_cpu_s) / steps * 1e6,
        "owner_batch_us_per_step": delta("shell_s") / steps * 1e6,
        "owner_batch_cpu_us_per_step": delta("shell_cpu_s") / steps * 1e6,
        "owner_core_us_per_step": delta("core_s") / steps * 1e6,
        "owner_batches": delta("batches"),
        "owner_statements_per_step": delta("statements") / steps,
    }
