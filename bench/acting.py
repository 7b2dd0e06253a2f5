"""What tools that act cost the owner: a nested call and a subagent round trip, against a plain tool step and the
commit baseline, in the same run.

    python bench/acting.py [--json] [--runs 16] [--steps 50] [--rounds 2] [--sync normal|full]

An owner (through the bench-only launcher ``_steps_owner.py``) and one worker serving ``_acting_app.py``, started
as ``bench/steps.py`` starts them. Three variants of agent runs on the scripted model, each run making ``--steps``
model turns of one tool call each, then a text answer, ``--runs`` runs at once (one conversation each):

- ``plain``: the tool is a trivial ``safe`` tool (the baseline tool step);
- ``nested``: the tool makes one nested call (``call.execute_tool``) of a trivial tool and returns its value;
- ``subagent``: the tool is ``actors.subagent_tool(agent=...)`` whose agent answers at once with a text.

A step is one of the model's tool calls with everything it brings: for ``nested`` the nested call, for
``subagent`` the child conversation, its run and its model turn. Each variant is measured ``--rounds`` times (the
order reversed every other round, so a drift of the machine falls on every variant alike) and summed. Per variant:
the wall time from the submits until every run completed, steps/s, and per step the owner's process CPU (``/proc``),
its time inside batches (BEGIN, core, COMMIT, send) and in the core alone, its batches, its SQL statements (all from
the launcher), the commit-log records written (the database's ``commits`` table) and the worker's CPU. Ratios
nested/plain and subagent/plain, and the in-process APSW baseline of ``bench/commit_throughput.py`` measured in the
same run: steps/s over it, and the owner's CPU per step in baseline commits (the CPU per step times the baseline's
commits/s: how many in-process one-row commits the owner's time for a step would have made).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import trio
from _acting_app import ANSWER, ANSWERER_AGENT, NESTED_AGENT, PLAIN_AGENT, SUBAGENT_AGENT
from _common import (
    Served,
    Snapshot,
    bench_env,
    commit_seq,
    owner_and_worker,
    per_step,
    profiled_owner_command,
    snapshot,
)
from commit_throughput import baseline_commits_per_s

import actors

APP: Final = "_acting_app:app"
AGENTS: Final = {"plain": PLAIN_AGENT, "nested": NESTED_AGENT, "subagent": SUBAGENT_AGENT}
VARIANTS: Final = tuple(AGENTS)
BASELINE_S: Final = 2.0
DEADLINE_S: Final = 600


class _Window:
    """One measured window of one variant: its wall time, steps, and what the processes spent."""

    def __init__(self, elapsed_s: float, steps: int, before: Snapshot, after: Snapshot, commits: int) -> None:
        self.elapsed_s = elapsed_s
        self.steps = steps
        self.before = before
        self.after = after
        self.commits = commits


async def _completed_answers(client: actors.Client) -> int:
    """The subagents' runs that completed so far."""
    return sum(1 for run in await client.runs(status="completed") if run.agent == ANSWERER_AGENT)


async def _check(client: actors.Client, variant: str, run_ids: Sequence[str], steps: int) -> int:
    """The runs' completed tool steps (the model's calls), checked to be ``steps`` per run, each with what its
    variant brings: a nested call for ``nested``, the subagent's answer for ``subagent``."""
    done = nested = 0
    for run_id in run_ids:
        record = await client.run(run_id)
        assert record.status == "completed", record
        for op in await client.operations(run_id):
            if op.kind != "tool":
                continue
            assert op.status == "completed" and not op.is_error, op
            if op.parent_operation_id is None:
                done += 1
                if variant == "subagent":
                    assert ANSWER in json.dumps(op.result), op
            else:
                nested += 1
    assert done == len(run_ids) * steps, (variant, done, len(run_ids), steps)
    assert nested == (done if variant == "nested" else 0), (variant, nested, done)
    return done


async def _measure(
    served: Served, client: actors.Client, db: str, stats_path: Path, variant: str, runs: int, steps: int
) -> _Window:
    """``runs`` runs of ``variant`` at once: conversations made first, then the window from the submits until every
    run completed, then the check (outside the window)."""
    conversations = [await client.create_conversation(agent=AGENTS[variant]) for _ in range(runs)]
    answers = await _completed_answers(client) if variant == "subagent" else 0
    commits = commit_seq(db)
    before = await snapshot(served, stats_path)
    started = time.perf_counter()
    run_ids: list[str] = []
    for conversation in conversations:
        submission = await client.submit(conversation, kind="input", payload="go", request_id="bench")
        assert submission.run_id is not None
        run_ids.append(submission.run_id)
    for run_id in run_ids:
        await client.wait_for_run(run_id)
    elapsed = time.perf_counter() - started
    after = await snapshot(served, stats_path, ending=True)
    commits = commit_seq(db) - commits
    done = await _check(client, variant, run_ids, steps)
    if variant == "subagent":
        answered = await _completed_answers(client) - answers
        assert answered == done, (answered, done)  # one subagent run per step
    return _Window(elapsed, done, before, after, commits)


def _total(windows: Sequence[_Window]) -> dict[str, float]:
    """The windows' sums, per step: a snapshot from nothing to the sum of their differences."""
    zero = Snapshot(0.0, 0.0, {})
    keys = {key for window in windows for key in window.after.stats}
    summed = Snapshot(
        sum(w.after.owner_cpu_s - w.before.owner_cpu_s for w in windows),
        sum(w.after.worker_cpu_s - w.before.worker_cpu_s for w in windows),
        {key: sum(float(w.after.stats[key]) - float(w.before.stats[key]) for w in windows) for key in keys},
    )
    steps = sum(w.steps for w in windows)
    elapsed = sum(w.elapsed_s for w in windows)
    return {
        "wall_s": elapsed,
        "steps_per_s": steps / elapsed,
        "wall_us_per_step": elapsed / steps * 1e6,
        **per_step(zero, summed, steps),
        "commit_records_per_step": sum(w.commits for w in windows) / steps,
    }


async def measure(directory: str, sync: str, runs: int, steps: int, rounds: int) -> dict[str, dict[str, float]]:
    """Every variant ``rounds`` times on one owner and one worker, after one warm-up run of each."""
    db = os.path.join(directory, "acting.db")
    stats_path = Path(directory) / "acting-owner-stats.json"
    env = bench_env(BENCH_ACTING_STEPS=str(steps))
    windows: dict[str, list[_Window]] = {variant: [] for variant in VARIANTS}
    async with owner_and_worker(db, env, profiled_owner_command(db, stats_path, sync), app=APP) as served:
        with trio.fail_after(DEADLINE_S):
            async with actors.connect(db=db, wait_for_owner_s=30) as client:
                for variant in VARIANTS:  # the worker is attached and every path warm
                    await _measure(served, client, db, stats_path, variant, 1, steps)
                for round_number in range(rounds):
                    order = VARIANTS if round_number % 2 == 0 else VARIANTS[::-1]
                    for variant in order:
                        windows[variant].append(await _measure(served, client, db, stats_path, variant, runs, steps))
    return {variant: _total(measured) for variant, measured in windows.items()}


ROUNDING: Final = {
    "wall_s": 2,
    "steps_per_s": 1,
    "wall_us_per_step": 0,
    "steps": 0,
    "owner_batches": 0,
    "owner_statements_per_step": 1,
    "commit_records_per_step": 2,
}


def run(sync: str, runs: int, steps: int, rounds: int) -> dict[str, Any]:
    """The baseline, then the three variants; one dict (one JSON object) with all of it."""
    with tempfile.TemporaryDirectory(prefix="tether-bench-acting-") as directory:
        baseline = baseline_commits_per_s(directory, sync, BASELINE_S)
        measured = trio.run(measure, directory, sync, runs, steps, rounds)
    results: dict[str, Any] = {
        "benchmark": "acting",
        "runs": runs,
        "steps_per_run": steps,
        "rounds": rounds,
        "sync": sync,
        "cpu_count": os.cpu_count(),
        "baseline_commits_per_s": round(baseline),
    }
    for variant, figures in measured.items():
        rounded = {key: round(value, ROUNDING.get(key, 1)) for key, value in figures.items()}
        rounded["steps_over_baseline"] = round(figures["steps_per_s"] / baseline, 4)
        rounded["owner_cpu_per_step_in_baseline_commits"] = round(figures["owner_cpu_us_per_step"] * baseline / 1e6, 1)
        results[variant] = rounded
    plain = measured["plain"]
    for variant in ("nested", "subagent"):
        figures = measured[variant]
        results[f"{variant}_over_plain"] = {
            "owner_cpu_per_step": round(figures["owner_cpu_us_per_step"] / plain["owner_cpu_us_per_step"], 2),
            "wall_per_step": round(figures["wall_us_per_step"] / plain["wall_us_per_step"], 2),
            "owner_core_per_step": round(figures["owner_core_us_per_step"] / plain["owner_core_us_per_step"], 2),
            "owner_statements_per_step": round(
                figures["owner_statements_per_step"] / plain["owner_statements_per_step"], 2
            ),
            "commit_records_per_step": round(figures["commit_records_per_step"] / plain["commit_records_per_step"], 2),
            "owner_cpu_us_added_per_step": round(figures["owner_cpu_us_per_step"] - plain["owner_cpu_us_per_step"]),
        }
    return results


def _print(results: dict[str, Any]) -> None:
    print(
        f"in-process baseline (APSW, WAL, synchronous={results['sync'].upper()}, one row per commit): "
        f"{results['baseline_commits_per_s']:,} commits/s"
    )
    print(
        f"{results['runs']} runs at once x {results['steps_per_run']} steps (a model turn of one tool call each, then "
        f"a text answer), {results['rounds']} round(s) summed, {results['cpu_count']} cores"
    )
    print(f"\n{'variant':<9} {'wall s':>7} {'steps/s':>8} {'x baseline':>10} {'wall us/step':>12}")
    for variant in VARIANTS:
        v = results[variant]
        print(
            f"{variant:<9} {v['wall_s']:>7.2f} {v['steps_per_s']:>8.1f} {v['steps_over_baseline']:>10.4f} "
            f"{v['wall_us_per_step']:>12,.0f}"
        )
    print(
        f"\nper step  {'owner CPU us':>12} {'in commits':>10} {'batches us':>10} {'core us':>8} {'batches':>7} "
        f"{'SQL':>6} {'records':>7} {'worker CPU us':>13}"
    )
    for variant in VARIANTS:
        v = results[variant]
        print(
            f"{variant:<9} {v['owner_cpu_us_per_step']:>12,.0f} {v['owner_cpu_per_step_in_baseline_commits']:>10.1f} "
            f"{v['owner_batch_us_per_step']:>10,.0f} {v['owner_core_us_per_step']:>8,.0f} "
            f"{v['owner_batches'] / v['steps']:>7.2f} {v['owner_statements_per_step']:>6.1f} "
            f"{v['commit_records_per_step']:>7.2f} {v['worker_cpu_us_per_step']:>13,.0f}"
        )
    print(
        "(owner CPU: /proc; in commits: that CPU as baseline commits; batches us / core us: wall time in the owner's "
        "batches and in its core; batches, SQL statements and commit-log records per step; worker CPU: /proc)"
    )
    print()
    for variant, what in (("nested", "a nested call"), ("subagent", "a subagent round trip")):
        r = results[f"{variant}_over_plain"]
        print(
            f"{variant}/plain: owner CPU per step {r['owner_cpu_per_step']:.2f}x "
            f"({r['owner_cpu_us_added_per_step']:+,} us: {what}), wall per step {r['wall_per_step']:.2f}x, "
            f"core {r['owner_core_per_step']:.2f}x, "
            f"SQL {r['owner_statements_per_step']:.2f}x, commit records {r['commit_records_per_step']:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=16, help="runs at once in each variant (16)")
    parser.add_argument("--steps", type=int, default=50, help="model turns of one tool call per run (50)")
    parser.add_argument(
        "--rounds", type=int, default=2, help="measurements of each variant, summed; every other in reverse order (2)"
    )
    parser.add_argument(
        "--sync",
        choices=("normal", "full"),
        default="normal",
        help="the owner's and the baseline's synchronous setting (normal, the owner's default)",
    )
    args = parser.parse_args()
    if args.runs < 1 or args.steps < 1 or args.rounds < 1:
        parser.error("--runs, --steps and --rounds must be 1 or more")
    results = run(args.sync, args.runs, args.steps, args.rounds)
    if args.json:
        print(json.dumps(results))
    else:
        _print(results)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
