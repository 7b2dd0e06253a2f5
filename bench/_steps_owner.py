"""``tether owner`` with a bench-only timer around its batches, for ``bench/steps.py``.

    python bench/_steps_owner.py STATS_FILE owner --db DB ...

Wraps ``OwnerServer._run_batch`` (BEGIN, the core's batch, COMMIT, sending what it produced) and
``OwnerCore.run_batch`` (the sans-IO core alone) with ``perf_counter``/``thread_time`` in this process only, then
runs the ordinary CLI. On SIGUSR1 it writes the running totals to STATS_FILE (JSON); the benchmark takes the
difference of two dumps around its measured window. The totals also count the SQL statements the owner's store ran
(``statements``: each statement executed, read from APSW's statement cache counters of its connection, which count
every prepare, cached or not; no hook on the statements themselves). The owner's code is unchanged: without this
launcher nothing is timed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import apsw

from runtime import main
from storage_owner.core import OwnerCore
from storage_owner.io._server import OwnerServer
from storage_owner.store import SqliteStore

TOTALS: dict[str, float] = {"batches": 0, "shell_s": 0.0, "shell_cpu_s": 0.0, "core_s": 0.0, "core_cpu_s": 0.0}
STORES: list[SqliteStore] = []
"""The stores this process opened (the owner opens one)."""


def _timed(function: Callable[..., Any], wall_key: str, cpu_key: str, count_key: str | None) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            TOTALS[wall_key] += time.perf_counter() - wall
            TOTALS[cpu_key] += time.thread_time() - cpu
            if count_key is not None:
                TOTALS[count_key] += 1

    return timed


def _noting(init: Callable[..., None]) -> Callable[..., None]:
    def noted(self: SqliteStore, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        STORES.append(self)

    return noted


def _statements() -> int:
    """SQL statements run so far on the stores' connections (closed ones are left out: read while serving)."""
    total = 0
    for store in STORES:
        try:
            stats = store._db.cache_stats()
        except apsw.ConnectionClosedError:
            continue
        total += stats["hits"] + stats["misses"] + stats["no_cache"]
    return total


def _dump(path: str) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump({**TOTALS, "statements": _statements(), "dumped_at": time.time()}, out)
    os.replace(temporary, path)


if __name__ == "__main__":
    stats_path = sys.argv[1]
    OwnerServer._run_batch = _timed(OwnerServer._run_batch, "shell_s", "shell_cpu_s", "batches")  # type: ignore[method-assign]
    OwnerCore.run_batch = _timed(OwnerCore.run_batch, "core_s", "core_cpu_s", None)  # type: ignore[method-assign]
    SqliteStore.__init__ = _noting(SqliteStore.__init__)  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, lambda *_: _dump(stats_path))
    raise SystemExit(main(sys.argv[2:]))
