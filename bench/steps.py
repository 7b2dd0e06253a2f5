"""Durable steps per second: Tether's against DBOS Transact's, in the same run, beside the commit baseline.

    python bench/steps.py [--json] [--variant task|tool] [--steps 300] [--sync normal|full]

- Tether, variant ``task`` (today): an owner and one worker started by the benchmark; a task kind whose every
  phase does trivial work and commits one new checkpoint (``rt.advance``; the last one completes), so one durable
  step is one committed state and one lease round trip. ``--steps`` steps per task, 1 and 16 tasks at once.
- Tether, variant ``tool``: a tool call with its intent and result commits, on the scripted model. Not built yet
  (it needs agent runs): :func:`tool_steps_per_s` is the one function to fill.
- DBOS Transact (the ``[bench]`` extra): a workflow of ``--steps`` trivial ``@DBOS.step()`` calls, each a durable
  checkpoint in its SQLite system database as shipped, 1 and 16 workflows at once.
- The owner's own time per step, during the 16-task run: its process CPU (``/proc``, no hook) and, through the
  bench-only launcher ``_steps_owner.py``, the time inside its batches (BEGIN, the core, COMMIT, sending) and in
  the sans-IO core alone, each divided by the steps of the run.

Ratios are reported Tether/DBOS and each against the in-process APSW baseline of ``bench/commit_throughput.py``
measured in the same run, so a noisy machine shows in all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from commit_throughput import baseline_commits_per_s

import actors
from runtime import stop_gracefully, tether_command, wait_for_owner

HERE = Path(__file__).parent
CONCURRENCY = (1, 16)
GOAL_RATIO_AT_16 = 15.0
TOOL_NOT_BUILT = "the tool-step variant (intent + result commits per tool call, scripted model) needs agent runs"


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _owner_stats(owner: trio.Process, path: Path) -> dict[str, float]:
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


async def _task_run(client: actors.Client, concurrency: int, steps: int) -> float:
    """Seconds from creating ``concurrency`` tasks of ``steps`` steps each until every one completed."""
    started = time.perf_counter()
    async with client.commit() as tx:
        conversation = tx.create_conversation()
        ids = [
            tx.create_task("bench.steps", {"steps": steps}, conversation_id=conversation) for _ in range(concurrency)
        ]
    for task_id in ids:
        record = await client.wait_for_task(task_id)
        assert record.outcome is not None and record.outcome.status == "completed", record
    return time.perf_counter() - started


async def task_steps(directory: str, steps: int, sync: str) -> dict[str, Any]:
    """Variant ``task``: durable task steps per second at each concurrency, and the owner's time per step."""
    db = os.path.join(directory, "steps.db")
    stats_path = Path(directory) / "owner-stats.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    owner = await trio.lowlevel.open_process(
        [sys.executable, str(HERE / "_steps_owner.py"), str(stats_path), "owner", "--db", db, "--sync", sync],
        stdout=subprocess.DEVNULL,
        env=env,
    )
    worker: trio.Process | None = None
    try:
        with trio.fail_after(120):
            await wait_for_owner(db, owner)
            worker = await trio.lowlevel.open_process(
                tether_command("worker", "--db", db, "--app", "_steps_app:app"), stdout=subprocess.DEVNULL, env=env
            )
            async with actors.connect(db=db, wait_for_owner_s=30) as client:
                await _task_run(client, 1, 10)  # the worker is attached and warm
                per_s: dict[int, float] = {}
                profile: dict[str, float] = {}
                for concurrency in CONCURRENCY:
                    before = await _owner_stats(owner, stats_path)
                    cpu_before = _cpu_s(owner.pid), _cpu_s(worker.pid)
                    elapsed = await _task_run(client, concurrency, steps)
                    cpu_after = _cpu_s(owner.pid), _cpu_s(worker.pid)
                    after = await _owner_stats(owner, stats_path)
                    total = concurrency * steps
                    per_s[concurrency] = total / elapsed
                    if concurrency == max(CONCURRENCY):
                        profile = {
                            "steps": total,
                            "owner_cpu_us_per_step": (cpu_after[0] - cpu_before[0]) / total * 1e6,
                            "worker_cpu_us_per_step": (cpu_after[1] - cpu_before[1]) / total * 1e6,
                            "owner_batch_us_per_step": (after["shell_s"] - before["shell_s"]) / total * 1e6,
                            "owner_batch_cpu_us_per_step": (after["shell_cpu_s"] - before["shell_cpu_s"]) / total * 1e6,
                            "owner_core_us_per_step": (after["core_s"] - before["core_s"]) / total * 1e6,
                            "owner_batches": after["batches"] - before["batches"],
                        }
    finally:
        if worker is not None:
            await stop_gracefully(worker)
        await stop_gracefully(owner)
    return {"steps_per_s": per_s, "profile_at_16": profile}


async def tool_steps_per_s(directory: str, steps: int, sync: str) -> dict[str, Any]:
    """Variant ``tool``: a tool call with its intent and result commits per step, on the scripted model, at 1 and 16
    concurrent runs; the same result shape as :func:`task_steps`. To fill once agent runs exist."""
    raise NotImplementedError(TOOL_NOT_BUILT)


def dbos_steps(directory: str, steps: int) -> dict[str, Any]:
    try:
        import _steps_dbos
    except ImportError as exc:
        raise SystemExit(f"bench/steps.py needs DBOS Transact: pip install -e '.[bench]' ({exc})") from None
    return _steps_dbos.measure(directory, CONCURRENCY, steps)


def run(variant: str, steps: int, sync: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-steps-") as directory:
        baseline = baseline_commits_per_s(directory, sync, 2.0)
        dbos = dbos_steps(directory, steps)
        measure = task_steps if variant == "task" else tool_steps_per_s
        tether = trio.run(measure, directory, steps, sync)
    results: dict[str, Any] = {
        "variant": variant,
        "what": "task steps (one committed checkpoint per phase)" if variant == "task" else "tool steps",
        "steps_per_run": steps,
        "baseline_commits_per_s": round(baseline),
        "tether_settings": f"tether owner: WAL, synchronous={sync.upper()} (--sync {sync}; the baseline the same)",
        "dbos_version": dbos["version"],
        "dbos_settings": dbos["settings"],
    }
    for concurrency in CONCURRENCY:
        ours, theirs = tether["steps_per_s"][concurrency], dbos["steps_per_s"][concurrency]
        results[f"tether_steps_per_s_at_{concurrency}"] = round(ours)
        results[f"dbos_steps_per_s_at_{concurrency}"] = round(theirs)
        results[f"tether_over_dbos_at_{concurrency}"] = round(ours / theirs, 2)
        results[f"tether_over_baseline_at_{concurrency}"] = round(ours / baseline, 3)
        results[f"dbos_over_baseline_at_{concurrency}"] = round(theirs / baseline, 3)
    results.update({key: round(value, 1) for key, value in tether["profile_at_16"].items()})
    results["goal_at_16"] = f">= {GOAL_RATIO_AT_16:g}x DBOS"
    results["goal_met"] = results["tether_over_dbos_at_16"] >= GOAL_RATIO_AT_16
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--variant",
        choices=("task", "tool"),
        default="task",
        help="task: durable task steps (default); tool: tool calls on the scripted model (not built yet)",
    )
    parser.add_argument("--steps", type=int, default=300, help="steps per task or workflow (300)")
    parser.add_argument(
        "--sync",
        choices=("normal", "full"),
        default="normal",
        help="the owner's and the baseline's synchronous setting (normal, the owner's default)",
    )
    args = parser.parse_args()
    if args.variant == "tool":
        parser.error(f"--variant tool is not built yet: {TOOL_NOT_BUILT}")
    results = run(args.variant, args.steps, args.sync)
    if args.json:
        print(json.dumps(results))
        return
    print(f"in-process baseline: {results['baseline_commits_per_s']:,} commits/s")
    print(f"Tether {results['what']}; {results['tether_settings']}")
    print(f"DBOS Transact {results['dbos_version']}: {results['dbos_settings']}")
    print(f"{'concurrent':<11} {'Tether steps/s':>15} {'DBOS steps/s':>13} {'Tether/DBOS':>12} {'Tether/base':>12}")
    for c in CONCURRENCY:
        print(
            f"{c:<11} {results[f'tether_steps_per_s_at_{c}']:>15,} {results[f'dbos_steps_per_s_at_{c}']:>13,} "
            f"{results[f'tether_over_dbos_at_{c}']:>11.2f}x {results[f'tether_over_baseline_at_{c}']:>12.3f}"
        )
    print(
        f"owner at 16: {results['owner_cpu_us_per_step']:.1f} us CPU per step (process), of which "
        f"{results['owner_batch_us_per_step']:.1f} us in batches (BEGIN, core, COMMIT, send; "
        f"{results['owner_core_us_per_step']:.1f} us in the core) over {results['owner_batches']:.0f} batches; "
        f"worker {results['worker_cpu_us_per_step']:.1f} us CPU per step"
    )
    verdict = "met" if results["goal_met"] else "NOT met"
    print(f"goal at 16: {results['goal_at_16']}: {verdict} ({results['tether_over_dbos_at_16']:.2f}x)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
