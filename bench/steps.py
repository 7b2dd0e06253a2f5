"""Durable steps per second: Tether's against DBOS Transact's, in the same run, beside the commit baseline.

    python bench/steps.py [--json] [--variant all|both|task|tool|tool10|stream] [--steps 300] [--tool-steps 100]
                          [--calls-per-turn 1] [--sync normal|full] [--stream-runs 16] [--stream-turns 8]
                          [--stream-seconds 4]

By default the Tether variants ``task``, ``tool`` and ``tool10`` are measured, against one DBOS measurement, and
reported in one JSON object, with issue 20's goals (ratios of figures of this same run) and whether each is met.

- Tether, variant ``task``: an owner and one worker started by the benchmark; a task kind whose every phase does
  trivial work and commits one new checkpoint (``rt.advance``; the last one completes), so one durable step is one
  committed state and one lease round trip. ``--steps`` steps per task, 1 and 16 tasks at once.
- Tether, variant ``tool``: agent runs on the scripted model (``_steps_app.py``, agent ``bench-tools``), each making
  ``--tool-steps`` calls of a trivial ``safe`` tool, ``--calls-per-turn`` to a model turn (1 by default: every tool
  step carries a whole model turn), then a text answer; 1 run and then 16 runs at once (one conversation each). A
  tool step is one tool call: its task's lease, its intent (in the model result's commit, for this ``safe`` tool)
  and its result commit, with its share of the model turn's intent and result and of the run's wait and resume;
  variant ``tool10`` the same at ten calls per turn. Counted as the runs' completed operations of kind ``tool``
  over the wall time from the submits until every run completed.
- Tether, variant ``stream`` (``_steps_stream.py``, not in ``all``, no DBOS): ``--stream-runs`` runs whose model
  streams (a delta every 20 ms, a partial piece every 100 ms, ``--stream-turns`` turns each ending in a tool call):
  the time from the end of each model stream to the start of the tool call it asked for (the owner's overhead per
  step) p50/p99, from stamps taken in the worker, and the appends/s of an unrelated client (16 actors on their own
  connection) while they stream against its rate alone before and after, in the same run, as a ratio.
- DBOS Transact (the ``[bench]`` extra): a workflow of ``--steps`` trivial ``@DBOS.step()`` calls, each a durable
  checkpoint in its SQLite system database as shipped, 1 and 16 workflows at once.
- The owner's own time per step, during the measurement at 16: its process CPU (``/proc``, no hook) and, through
  the bench-only launcher ``_steps_owner.py``, the time inside its batches (BEGIN, the core, COMMIT, sending) and
  in the sans-IO core alone, each divided by the steps of the run.

Ratios are reported Tether/DBOS and each against the in-process APSW baseline of ``bench/commit_throughput.py``
measured in the same run, so a noisy machine shows in all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from _common import bench_env, commit_seq, owner_and_worker, per_step, profiled_owner_command, snapshot
from commit_throughput import baseline_commits_per_s

import actors

HERE = Path(__file__).parent
CONCURRENCY = (1, 16)
GOAL_RATIO_AT_16 = 15.0
TOOL_AGENT = "bench-tools"
BATCHED_CALLS_PER_TURN = 10
"""Variant ``tool10``: the tool steps of a model that calls ten tools per turn."""
VARIANTS = {"all": ("task", "tool", "tool10"), "both": ("task", "tool")}


Verify = Callable[[], Awaitable[None]]
"""What a measurement checks once its window is closed (reads that are not part of the steps' cost)."""


async def _nothing() -> None:
    pass


async def _task_run(client: actors.Client, concurrency: int, steps: int) -> tuple[float, int, Verify]:
    """Seconds from creating ``concurrency`` tasks of ``steps`` steps each until every one completed, and the steps."""
    started = time.perf_counter()
    async with client.commit() as tx:
        conversation = tx.create_conversation()
        ids = [
            tx.create_task("bench.steps", {"steps": steps}, conversation_id=conversation) for _ in range(concurrency)
        ]
    for task_id in ids:
        record = await client.wait_for_task(task_id)
        assert record.outcome is not None and record.outcome.status == "completed", record
    return time.perf_counter() - started, concurrency * steps, _nothing


async def _tool_run(client: actors.Client, concurrency: int, steps: int) -> tuple[float, int, Verify]:
    """Seconds from submitting one input to each of ``concurrency`` conversations bound to the bench agent until
    every run completed, the tool steps done, and the check that they were: the runs' operations of kind ``tool``
    that completed (read once the window is closed: reading every run's journal is not a step's cost)."""
    conversations = [await client.create_conversation(agent=TOOL_AGENT) for _ in range(concurrency)]
    started = time.perf_counter()
    runs = [
        (await client.submit(conversation, kind="input", payload="go", request_id="bench")).run_id
        for conversation in conversations
    ]
    for run_id in runs:
        assert run_id is not None
        record = await client.wait_for_run(run_id)
        assert record.status == "completed", record
    elapsed = time.perf_counter() - started

    async def verify() -> None:
        done = 0
        for run_id in runs:
            assert run_id is not None
            operations = await client.operations(run_id)
            done += sum(1 for op in operations if op.kind == "tool" and op.status == "completed")
        assert done == concurrency * steps, (done, concurrency, steps)

    return elapsed, concurrency * steps, verify


RunOnce = Callable[[actors.Client, int, int], Awaitable[tuple[float, int, Verify]]]


async def _tether_steps(
    directory: str, name: str, sync: str, run_once: RunOnce, steps: int, warm_steps: int, extra_env: dict[str, str]
) -> dict[str, Any]:
    """Start a profiled owner and one worker on the bench app, warm up with one run of ``warm_steps``, then time
    ``run_once`` at each concurrency: steps per second, and the owner's time per step at 16."""
    db = os.path.join(directory, f"{name}.db")
    stats_path = Path(directory) / f"{name}-owner-stats.json"
    owner_command = profiled_owner_command(db, stats_path, sync)
    async with owner_and_worker(db, bench_env(**extra_env), owner_command) as served:
        with trio.fail_after(300):
            async with actors.connect(db=db, wait_for_owner_s=30) as client:
                *_, verify = await run_once(client, 1, warm_steps)  # the worker is attached and warm
                await verify()
                per_s: dict[int, float] = {}
                profile: dict[str, float] = {}
                for concurrency in CONCURRENCY:
                    before, first_seq = await snapshot(served, stats_path), commit_seq(db)
                    elapsed, total, verify = await run_once(client, concurrency, steps)
                    after, last_seq = await snapshot(served, stats_path, ending=True), commit_seq(db)
                    await verify()
                    per_s[concurrency] = total / elapsed
                    if concurrency == max(CONCURRENCY):
                        profile = per_step(before, after, total)
                        profile["commits_per_step"] = (last_seq - first_seq) / total
    return {"steps_per_s": per_s, "profile_at_16": profile}


async def task_steps(directory: str, steps: int, sync: str) -> dict[str, Any]:
    """Variant ``task``: durable task steps per second at each concurrency, and the owner's time per step."""
    return await _tether_steps(directory, "task", sync, _task_run, steps, 10, {})


async def tool_steps(directory: str, steps: int, sync: str, calls_per_turn: int) -> dict[str, Any]:
    """Variant ``tool``: tool calls (each with its intent and result commits) per second on the scripted model, at
    1 and 16 concurrent runs (one conversation each), and the owner's time per tool step; the same result shape as
    :func:`task_steps`. The agent's script is fixed when the worker imports the app, so the warm-up run makes the
    same ``steps`` calls."""
    extra_env = {"BENCH_TOOL_STEPS": str(steps), "BENCH_TOOL_CALLS_PER_TURN": str(calls_per_turn)}
    name = "tool" if calls_per_turn == 1 else f"tool{calls_per_turn}"  # a database of its own
    return await _tether_steps(directory, name, sync, _tool_run, steps, steps, extra_env)


def dbos_steps(directory: str, steps: int) -> dict[str, Any]:
    try:
        import _steps_dbos
    except ImportError as exc:
        raise SystemExit(f"bench/steps.py needs DBOS Transact: pip install -e '.[bench]' ({exc})") from None
    return _steps_dbos.measure(directory, CONCURRENCY, steps)


WHAT = {
    "task": "task steps (one committed checkpoint per phase)",
    "tool": "tool steps (one tool call: its tool task's lease and result + completion commit, its intent, and its "
    "share of the model turn's intent and result and of the run's wait and resume; {calls} call(s) per model turn)",
}
WHAT["tool10"] = WHAT["tool"]

GOALS: tuple[tuple[str, str, str, float], ...] = (
    # (what, how it is computed, comparison, target): issue 20's table, each a ratio measured in this run
    ("owner CPU per tool step / per task step", "owner_cpu_tool_over_task", "<=", 2.5),
    ("worker CPU per tool step / per task step", "worker_cpu_tool_over_task", "<=", 3.0),
    ("tool steps/s at 16 runs / DBOS's, one call per turn", "tool_over_dbos_at_16", ">=", 4.0),
    ("tool steps/s at 16 runs / DBOS's, ten calls per turn", "tool10_over_dbos_at_16", ">=", 8.0),
    ("tool steps/s at 1 run / DBOS's (one agent's latency)", "tool_over_dbos_at_1", ">=", 1.5),
    ("task steps/s at 16 / DBOS's", "task_over_dbos_at_16", ">=", 15.0),
)
"""Issue 20's goals this benchmark measures: each is reported with its value and whether it is met."""


def _variant(name: str, tether: dict[str, Any], dbos: dict[str, Any], baseline: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
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


def run_stream(runs: int, turns: int, seconds: float) -> dict[str, Any]:
    """Variant ``stream``: the owner's overhead per step under streaming runs, and their cost to another client."""
    import _steps_stream

    with tempfile.TemporaryDirectory(prefix="tether-bench-stream-") as directory:
        result = trio.run(_steps_stream.measure, directory, runs, seconds, turns)
    return {"variants": ["stream"], "stream": result}


def _print_stream(result: dict[str, Any]) -> None:
    print(
        f"{result['runs']} streaming runs x {result['turns_per_run']} steps: stream end -> next tool call start "
        f"p50 {result['step_overhead_p50_ms']} ms, p99 {result['step_overhead_p99_ms']} ms, max "
        f"{result['step_overhead_max_ms']} ms over {result['steps']} steps ({result['steps_in_window']} while the "
        "writer ran: p50 {0} ms, p99 {1} ms); one run alone: p50 {2} ms".format(
            result.get("step_overhead_p50_ms_in_window"),
            result.get("step_overhead_p99_ms_in_window"),
            result["step_overhead_p50_ms_one_run_alone"],
        )
    )
    print(
        f"unrelated client ({result['writer_actors']} actors): {result['appends_per_s_alone_before']:,} appends/s "
        f"alone before, {result['appends_per_s_while_streaming']:,} while streaming, "
        f"{result['appends_per_s_alone_after']:,} alone after: ratio {result['ratio']}"
    )
    owner, worker = result["owner_worker_cpu_while_streaming"]
    owner_alone, worker_alone = result["owner_worker_cpu_alone_before"]
    print(
        f"CPU (of one core) while streaming: owner {owner}, worker {worker}; alone: owner {owner_alone}, "
        f"worker {worker_alone}"
    )


def run(
    variants: tuple[str, ...], steps: int, sync: str, tool_steps_per_run: int, calls_per_turn: int
) -> dict[str, Any]:
    """Measure the baseline, DBOS once, then each Tether variant; one dict (one JSON object) with all of it."""
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tether-bench-steps-") as directory:
        baseline = baseline_commits_per_s(directory, sync, 2.0)
        dbos = dbos_steps(directory, steps)
        if "task" in variants:
            measured["task"] = trio.run(task_steps, directory, steps, sync)
        if "tool" in variants:
            measured["tool"] = trio.run(tool_steps, directory, tool_steps_per_run, sync, calls_per_turn)
        if "tool10" in variants:
            measured["tool10"] = trio.run(tool_steps, directory, tool_steps_per_run, sync, BATCHED_CALLS_PER_TURN)
    results: dict[str, Any] = {
        "variants": list(variants),
        "steps_per_run": steps,
        "tool_steps_per_run": tool_steps_per_run,
        "tool_calls_per_turn": calls_per_turn,
        "baseline_commits_per_s": round(baseline),
        "tether_settings": f"tether owner: WAL, synchronous={sync.upper()} (--sync {sync}; the baseline the same)",
        "dbos_version": dbos["version"],
        "dbos_settings": dbos["settings"],
    }
    for name, tether in measured.items():
        calls = BATCHED_CALLS_PER_TURN if name == "tool10" else calls_per_turn
        results[name] = {"what": WHAT[name].format(calls=calls), **_variant(name, tether, dbos, baseline)}
    results["goals"] = goals(results)
    return results


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 20's goals whose figures this run measured: what, the value, the target and whether it is met. The
    ``tool`` ratios are those of one call per turn only when the run used ``--calls-per-turn 1``."""
    values: dict[str, float] = {}
    task, tool, tool10 = results.get("task"), results.get("tool"), results.get("tool10")
    if task is not None and tool is not None:
        values["owner_cpu_tool_over_task"] = tool["owner_cpu_us_per_step"] / task["owner_cpu_us_per_step"]
        values["worker_cpu_tool_over_task"] = tool["worker_cpu_us_per_step"] / task["worker_cpu_us_per_step"]
    if tool is not None and results["tool_calls_per_turn"] == 1:
        values["tool_over_dbos_at_16"] = tool["tether_over_dbos_at_16"]
        values["tool_over_dbos_at_1"] = tool["tether_over_dbos_at_1"]
    if tool10 is not None:
        values["tool10_over_dbos_at_16"] = tool10["tether_over_dbos_at_16"]
    if task is not None:
        values["task_over_dbos_at_16"] = task["tether_over_dbos_at_16"]
    found = []
    for what, key, comparison, target in GOALS:
        if key in values:
            value = values[key]
            met = value <= target if comparison == "<=" else value >= target
            found.append({"goal": what, "value": round(value, 2), "target": f"{comparison} {target:g}x", "met": met})
    return found


def _print(results: dict[str, Any]) -> None:
    print(f"telemetry: {'on (--otel)' if results.get('otel') else 'off'}")
    print(f"in-process baseline: {results['baseline_commits_per_s']:,} commits/s")
    print(results["tether_settings"])
    print(f"DBOS Transact {results['dbos_version']}: {results['dbos_settings']}")
    for name in results["variants"]:
        variant = results[name]
        per_run = results["steps_per_run" if name == "task" else "tool_steps_per_run"]
        print(f"\nTether {variant['what']}, {per_run} per run (DBOS: {results['steps_per_run']} per workflow)")
        print(f"{'concurrent':<11} {'Tether steps/s':>15} {'DBOS steps/s':>13} {'Tether/DBOS':>12} {'Tether/base':>12}")
        for c in CONCURRENCY:
            print(
                f"{c:<11} {variant[f'tether_steps_per_s_at_{c}']:>15,} {variant[f'dbos_steps_per_s_at_{c}']:>13,} "
                f"{variant[f'tether_over_dbos_at_{c}']:>11.2f}x {variant[f'tether_over_baseline_at_{c}']:>12.3f}"
            )
        print(
            f"owner at 16: {variant['owner_cpu_us_per_step']:.1f} us CPU per step (process), of which "
            f"{variant['owner_batch_us_per_step']:.1f} us in batches (BEGIN, core, COMMIT, send; "
            f"{variant['owner_core_us_per_step']:.1f} us in the core) over {variant['owner_batches']:.0f} batches; "
            f"worker {variant['worker_cpu_us_per_step']:.1f} us CPU per step; per step "
            f"{variant['commits_per_step']:.2f} commits (requests' and settles', from the commit log) and "
            f"{variant['owner_statements_per_step']:.1f} SQL statements"
        )
        if name == "task":
            verdict = "met" if variant["goal_met"] else "NOT met"
            print(f"goal at 16: {variant['goal_at_16']}: {verdict} ({variant['tether_over_dbos_at_16']:.2f}x)")
    if results["goals"]:
        print("\nissue 20's goals, measured in this run:")
        for goal in results["goals"]:
            verdict = "met" if goal["met"] else "NOT met"
            print(f"  {goal['goal']:<56} {goal['value']:>7.2f}x  goal {goal['target']:<8} {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--variant",
        choices=("all", "both", "task", "tool", "tool10", "stream"),
        default="all",
        help=(
            "task: durable task steps; tool: tool calls on the scripted model (--calls-per-turn to a turn); tool10: "
            "the same at ten calls per turn; all (default): task, tool and tool10, with issue 20's goals; both: task "
            "and tool; stream: the owner's overhead per step while runs stream, and its cost to another client"
        ),
    )
    parser.add_argument("--steps", type=int, default=300, help="steps per task, run or workflow (300)")
    parser.add_argument(
        "--tool-steps",
        type=int,
        default=100,
        help="variant tool: tool calls per run (100; a run's cost per call grows with its length, see docs)",
    )
    parser.add_argument(
        "--calls-per-turn", type=int, default=1, help="variant tool: tool calls per model turn (1: a turn per call)"
    )
    parser.add_argument(
        "--sync",
        choices=("normal", "full"),
        default="normal",
        help="the owner's and the baseline's synchronous setting (normal, the owner's default)",
    )
    parser.add_argument(
        "--otel",
        action="store_true",
        help="the owner and the worker trace and measure (TETHER_OTEL=1) on SDK providers that drop what they "
        "export (bench/_otel_site/sitecustomize.py): the overhead of telemetry on",
    )
    parser.add_argument("--stream-runs", type=int, default=16, help="variant stream: runs streaming at once (16)")
    parser.add_argument("--stream-turns", type=int, default=8, help="variant stream: steps per run (8)")
    parser.add_argument(
        "--stream-seconds", type=float, default=4.0, help="variant stream: the unrelated client's window (4)"
    )
    args = parser.parse_args()
    if args.otel:
        # Read by bench_env for the owner and worker processes (this process, a client, makes no telemetry).
        os.environ["TETHER_OTEL"] = "1"
        site = str(Path(__file__).parent / "_otel_site")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH", "")]))
    if args.calls_per_turn < 1 or args.tool_steps < 1 or args.steps < 1:
        parser.error("--steps, --tool-steps and --calls-per-turn must be 1 or more")
    if args.stream_runs < 1 or args.stream_turns < 1 or not args.stream_seconds > 0:
        parser.error("--stream-runs, --stream-turns and --stream-seconds must be positive")
    if args.variant == "stream":
        results = run_stream(args.stream_runs, args.stream_turns, args.stream_seconds)
    else:
        variants = VARIANTS.get(args.variant, (args.variant,))
        results = run(variants, args.steps, args.sync, args.tool_steps, args.calls_per_turn)
        results["otel"] = args.otel
    if args.json:
        print(json.dumps(results))
    elif args.variant == "stream":
        _print_stream(results["stream"])
    else:
        _print(results)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
