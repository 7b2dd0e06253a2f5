"""DBOS Transact's side of ``bench/steps.py``: a workflow of trivial ``@DBOS.step()`` calls on a SQLite system
database, as shipped (only ``name`` and ``system_database_url`` are configured). Needs the ``[bench]`` extra."""

from __future__ import annotations

import importlib.metadata
import os
import sqlite3
import time
from typing import Any

from dbos import DBOS, DBOSConfig


@DBOS.step()
def bench_step(value: int) -> int:
    """The trivial work of one step; DBOS checkpoints its result in the system database."""
    return value + 1


@DBOS.workflow()
def bench_steps(steps: int) -> int:
    value = 0
    for _ in range(steps):
        value = bench_step(value)
    return value


def _run(concurrency: int, steps: int) -> float:
    started = time.perf_counter()
    handles = [DBOS.start_workflow(bench_steps, steps) for _ in range(concurrency)]
    results = [handle.get_result() for handle in handles]
    elapsed = time.perf_counter() - started
    assert results == [steps] * concurrency, results
    return concurrency * steps / elapsed


def measure(directory: str, concurrency: tuple[int, ...], steps: int) -> dict[str, Any]:
    """Steps per second at each concurrency (workflows started at once), after a small warm-up."""
    path = os.path.join(directory, "dbos-system.sqlite")
    config: DBOSConfig = {
        "name": "tether-bench-steps",
        "system_database_url": f"sqlite:///{path}",
        "log_level": "WARNING",  # quiet output only
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        _run(1, 10)
        per_s = {c: _run(c, steps) for c in concurrency}
    finally:
        DBOS.destroy(destroy_registry=False)
    with sqlite3.connect(path) as db:
        journal = db.execute("PRAGMA journal_mode").fetchone()[0]
        # synchronous is per connection: a fresh connection shows the default DBOS leaves in place (it sets none).
        synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[db.execute("PRAGMA synchronous").fetchone()[0]]
    return {
        "version": importlib.metadata.version("dbos"),
        "settings": f"SQLite system database as shipped: journal_mode={journal}, synchronous={synchronous} (default)",
        "steps_per_s": per_s,
    }
