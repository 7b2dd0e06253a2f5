"""Commit throughput: acknowledged durable commits per second through the owner, against an in-process baseline.

The owner runs in its own process; writers run in other processes and use the project's own client
(``actors.connect``). Each run reports commits per second and p50/p99 acknowledgement latency. In the same run the
baseline measures one-row-per-transaction commits per second with APSW in-process, under the same sync setting,
so the figures read as ratios rather than machine-dependent times. It ends with the goals of issue 20 (a commit path
that keeps its speed with checkpoints running) that these figures measure, each said met or not.

    python bench/commit_throughput.py [--json] [--sync normal|full] [--duration 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import apsw
import trio

from runtime import start_owner, stop_gracefully

RUNS = ((1, 1), (16, 1), (256, 2))
"""(actors, processes) per run."""
WRITER = str(Path(__file__).with_name("_writer.py"))
GOALS = (
    ("commits/s at 256 actors / in-process baseline, checkpoints running", 256, "ratio_to_baseline", ">=", 0.3),
    ("p99 ms at 16 actors", 16, "p99_ms", "<=", 3.0),
)
"""Issue 20's goals: (what, actors of the run, its figure, comparison, target)."""


def baseline_commits_per_s(directory: str, sync: str, duration_s: float) -> float:
    """One row per transaction, APSW in this process, WAL, the same synchronous setting."""
    db = apsw.Connection(os.path.join(directory, "baseline.db"))
    db.execute("PRAGMA journal_mode=WAL").fetchall()
    db.execute(f"PRAGMA synchronous={'FULL' if sync == 'full' else 'NORMAL'}")
    db.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
    payload = b"x" * 80
    count = 0
    deadline = time.perf_counter() + duration_s
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        for _ in range(100):
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO rows (data) VALUES (?)", (payload,))
            db.execute("COMMIT")
        count += 100
    elapsed = time.perf_counter() - started
    db.close()
    return count / elapsed


def _percentile(sorted_values: list[int], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return sorted_values[index] / 1000


async def measure(directory: str, sync: str, actors: int, processes: int, duration_s: float) -> dict[str, object]:
    db = os.path.join(directory, f"owner-{actors}.db")
    owner, info = await start_owner(db, "--sync", sync, stdout=subprocess.DEVNULL)
    try:
        start_at = time.time() + 1.5  # time for every writer to connect and create its conversations
        per_process = actors // processes
        writers = [
            await trio.lowlevel.open_process(
                [sys.executable, WRITER, info.url, info.token, str(per_process), str(start_at), str(duration_s)],
                stdout=subprocess.PIPE,
            )
            for _ in range(processes)
        ]
        outputs = []
        for writer in writers:
            assert writer.stdout is not None
            chunks = []
            while chunk := await writer.stdout.receive_some(1 << 20):
                chunks.append(chunk)
            if await writer.wait() != 0:
                raise RuntimeError(f"a writer process failed with status {writer.returncode}")
            outputs.append(json.loads(b"".join(chunks)))
    finally:
        await stop_gracefully(owner)
    commits = sum(output["commits"] for output in outputs)
    latencies = sorted(latency for output in outputs for latency in output["latencies_us"])
    return {
        "actors": actors,
        "processes": processes,
        "commits": commits,
        "commits_per_s": round(commits / duration_s),
        "p50_ms": round(_percentile(latencies, 0.50), 3),
        "p99_ms": round(_percentile(latencies, 0.99), 3),
        "mean_ms": round(statistics.fmean(latencies) / 1000, 3) if latencies else None,
    }


async def run(sync: str, duration_s: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as directory:
        baseline = baseline_commits_per_s(directory, sync, duration_s)
        runs = [await measure(directory, sync, actors, processes, duration_s) for actors, processes in RUNS]
    for entry in runs:
        entry["ratio_to_baseline"] = round(float(entry["commits_per_s"]) / baseline, 3)  # type: ignore[arg-type]
    return {
        "benchmark": "commit_throughput",
        "sync": sync,
        "duration_s": duration_s,
        "cpu_count": os.cpu_count(),
        "baseline_commits_per_s": round(baseline),
        "runs": runs,
        "goals": goals(runs),
    }


def goals(runs: list[dict[str, object]]) -> list[dict[str, object]]:
    """Each goal of :data:`GOALS` with the figure measured and whether it is met."""
    by_actors = {entry["actors"]: entry for entry in runs}
    measured = []
    for what, actors, figure, comparison, target in GOALS:
        value = float(by_actors[actors][figure])  # type: ignore[arg-type]
        met = value >= target if comparison == ">=" else value <= target
        measured.append({"goal": f"{what} {comparison} {target:g}", "measured": value, "met": met})
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--sync", choices=("normal", "full"), default="normal")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per run (default 3)")
    args = parser.parse_args()
    result = trio.run(run, args.sync, args.duration)
    if args.json:
        print(json.dumps(result))
        return
    print(f"commit throughput, sync={args.sync}, {args.duration:g} s per run, {os.cpu_count()} cores")
    print(f"baseline (APSW in-process, one row per transaction): {result['baseline_commits_per_s']:,} commits/s")
    print(f"{'actors':>7} {'procs':>5} {'commits/s':>10} {'x baseline':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for entry in result["runs"]:  # type: ignore[attr-defined]
        print(
            f"{entry['actors']:>7} {entry['processes']:>5} {entry['commits_per_s']:>10,} "
            f"{entry['ratio_to_baseline']:>10} {entry['p50_ms']:>8} {entry['p99_ms']:>8}"
        )
    print("goals of issue 20:")
    for goal in result["goals"]:  # type: ignore[attr-defined]
        print(f"  {goal['goal']}: {goal['measured']:g}, {'met' if goal['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
