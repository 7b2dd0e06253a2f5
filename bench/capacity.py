"""How many concurrent agent runs one owner with two workers sustains, each run within 1.2x its ideal wall time.

    python bench/capacity.py [--json] [--ladder 1,50,100,200,400,800,1000,1600,2000,3200,4000] [--turns 10]
                             [--turn-s 1.0] [--limit 1.2] [--spread-s 1.0] [--connections 4] [--max-leases 20000]
                             [--max-concurrent-runs 100000] [--refine 3] [--deadline-s 900]

One owner (``tether owner``) and two worker processes (``tether worker``) serving ``_capacity_app.py``, started
as ``bench/steps.py`` starts its owner and worker. The agent ``bench-capacity`` has a model that takes ``--turn-s``
(1 s) before each of its ``--turns`` (10) turns, each of which calls a trivial ``safe`` tool once, then answers
with a text at once: a run is 10 model turns and 10 tool calls, and its ideal wall time is ``turns x turn_s``
(10 s); everything above it is Tether's (and the machine's).

For each N of the ladder, on the same processes: N conversations bound to the agent are created first, then N
runs are submitted, one per conversation, spread evenly over ``--spread-s`` (one model turn by default: a steady
load, not a burst; 0 submits all at once), from one process over ``--connections`` client connections. A run's
wall time is measured from the start of its submit to the return of its ``wait_for_run`` (what a caller sees),
and divided by the ideal. The criterion is the **max** over the N runs (every run within ``--limit`` x its ideal;
p50 and p99 are printed beside it). The ladder stops at the first N past the limit (or that does not complete
within 3x the ideal plus a minute), then tries up to ``--refine`` N halfway between the largest N within the limit
and the smallest past it (until they are within 10 % of each other), or stops when ``--deadline-s`` would be passed;
the figure is the largest N measured within the limit (the true capacity lies between it and the smallest N past
it).

Per N: the CPU of the owner, each worker and this client over the window (from the first submit to the last
completion, ``/proc``, in % of one core), the CPU every other process on the machine took meanwhile (``/proc/stat``
less ours: on a shared machine, what the runs competed with), the time the owner's and the workers' main threads
waited for a core while runnable (``/proc/<pid>/schedstat``: work ready, no CPU to run it), and the peak resident
memory (VmRSS, sampled every 0.25 s) of the owner and each worker. At the end, the CPU per tool turn (one model turn
with its tool call, and its share of the run's submit and answer) of the owner and of all the processes at the
largest N that completed, and the N that CPU alone would allow: one core of owner, and the machine's cores for
everything; and the commit-log records written per turn (the database's ``commits`` table).

Bounds raised for the measurement, and said in the output: the owner lets at most ``--max-concurrent-runs`` runs be
busy at once (``tether owner``'s default, 64: later ones wait ``queued``, so with the defaults N stops at 64 whatever
the CPU); a worker holds one lease per running run (also while it waits on its model) and one per running tool call,
and runs at most ``--max-leases`` of them (``tether worker``'s default, 64, would hold two workers to some 128 runs
less their tool calls in flight).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import trio
from _capacity_app import AGENT, ANSWER, TURN_S_ENV, TURNS_ENV, WARM_AGENT
from _common import bench_env, commit_seq, cpu_s

import actors
from runtime import stop_gracefully, tether_command, wait_for_owner

APP: Final = "_capacity_app:app"
WORKERS: Final = 2
LADDER: Final = (1, 50, 100, 200, 400, 800, 1000, 1600, 2000, 3200, 4000)
GOAL_RUNS: Final = 1000
CREATE_PER_COMMIT: Final = 200
"""Conversations created per transaction before a window."""
SAMPLE_S: Final = 0.25
"""How often the resident memory of the processes is read during a window."""
WINDOW_GRACE_S: Final = 60.0
"""A window is given up after 3x the ideal (the limit plus one, if more) plus this: its N counts as past the limit."""
SETTLE_S: Final = 2.0
"""Pause between two windows, so a window starts on idle processes."""


class Served(NamedTuple):
    owner: trio.Process
    workers: tuple[trio.Process, ...]


@contextlib.asynccontextmanager
async def owner_and_workers(
    db: str, env: dict[str, str], max_leases: int, max_concurrent_runs: int
) -> AsyncIterator[Served]:
    """An owner on ``db`` letting ``max_concurrent_runs`` runs be busy at once and, once it listens, ``WORKERS``
    workers serving the capacity app with ``max_leases`` each; all stopped gracefully when the block ends."""
    owner_command = tether_command("owner", "--db", db, "--max-concurrent-runs", str(max_concurrent_runs))
    owner = await trio.lowlevel.open_process(owner_command, stdout=subprocess.DEVNULL, env=env)
    workers: list[trio.Process] = []
    try:
        await wait_for_owner(db, owner)
        for number in range(WORKERS):
            command = tether_command(
                "worker", "--db", db, "--app", APP, "--name", f"capacity-{number + 1}", "--max-leases", str(max_leases)
            )
            workers.append(await trio.lowlevel.open_process(command, stdout=subprocess.DEVNULL, env=env))
        yield Served(owner=owner, workers=tuple(workers))
    finally:
        for worker in workers:
            await stop_gracefully(worker)
        await stop_gracefully(owner)


def runqueue_wait_s(pid: int) -> float:
    """Seconds the process's main thread has waited for a CPU while runnable so far (``/proc/<pid>/schedstat``'s
    second field): time it had work to do and no core to do it on."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def rss_mib(pid: int) -> float:
    """The resident memory of a process now (VmRSS, /proc), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for process {pid}")


def machine_cpu_s() -> float:
    """CPU seconds the machine's processes ran so far, every core (``/proc/stat``: user, nice, system, irq and
    softirq; not idle, iowait, or the time the hypervisor stole, and guest time is inside user already)."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]
    )
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


async def _sample_rss(pids: Sequence[int], peaks: list[float]) -> None:
    """Keep in ``peaks`` the largest resident memory of each process seen so far, until cancelled."""
    while True:
        for index, pid in enumerate(pids):
            peaks[index] = max(peaks[index], rss_mib(pid))
        await trio.sleep(SAMPLE_S)


async def _wait_for_workers(client: actors.Client) -> None:
    """Until ``WORKERS`` attached workers announce the capacity agent."""
    while True:
        peers = await client.peers()
        serving = [p for p in peers if p.role == "worker" and any(c.name == AGENT for c in p.capabilities)]
        if len(serving) >= WORKERS:
            return
        await trio.sleep(0.1)


async def _conversations(client: actors.Client, agent: str, count: int) -> list[str]:
    """``count`` new conversations bound to ``agent``, ``CREATE_PER_COMMIT`` to a transaction."""
    created: list[str] = []
    while len(created) < count:
        async with client.commit() as tx:
            batch = min(CREATE_PER_COMMIT, count - len(created))
            created.extend(tx.create_conversation(agent=agent) for _ in range(batch))
    return created


class _Runs:
    """What the runs of one window measured: each run's wall time (client), its owner-recorded time, its outcome."""

    def __init__(self) -> None:
        self.walls_s: list[float] = []
        self.recorded_s: list[float] = []
        self.failed: list[str] = []


async def _one_run(client: actors.Client, conversation: str, delay_s: float, runs: _Runs) -> None:
    """Wait ``delay_s``, submit one input to ``conversation``, wait for its run, and note the wall time between (or
    the error that ended the attempt: an N whose runs fail is past the limit)."""
    await trio.sleep(delay_s)
    started = time.perf_counter()
    try:
        submission = await client.submit(conversation, kind="input", payload="go", request_id="capacity")
        assert submission.run_id is not None, submission
        record = await client.wait_for_run(submission.run_id)
    except actors.TetherError as exc:  # such as Overloaded: the owner refused for a minute; the N is past the limit
        runs.failed.append(f"{conversation}: {type(exc).__name__}: {exc}")
        return
    runs.walls_s.append(time.perf_counter() - started)
    runs.recorded_s.append((record.updated_at_ms - record.created_at_ms) / 1000)
    if record.status != "completed" or record.answer is None or record.answer.text != ANSWER:
        runs.failed.append(f"{record.run_id}: {record.status} {record.reason or ''} {record.error or ''}".strip())


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


async def _window(
    db: str,
    served: Served,
    clients: Sequence[actors.Client],
    runs: int,
    turns: int,
    ideal_s: float,
    spread_s: float,
    limit: float,
) -> dict[str, Any]:
    """``runs`` runs at once: conversations made first (outside the window), then the window from the first submit
    to the last completion, with the processes' CPU (also per model turn of the runs, each with its tool call) and
    peak memory over it."""
    conversations = await _conversations(clients[0], AGENT, runs)
    pids = [served.owner.pid, *(worker.pid for worker in served.workers)]
    peaks = [0.0] * len(pids)
    measured = _Runs()
    records_before = commit_seq(db)
    cpu_before = [cpu_s(pid) for pid in pids]
    waits_before = [runqueue_wait_s(pid) for pid in pids]
    client_cpu_before = cpu_s(os.getpid())
    machine_before = machine_cpu_s()
    started = time.perf_counter()
    completed = False
    async with trio.open_nursery() as sampler:
        sampler.start_soon(_sample_rss, pids, peaks)
        with trio.move_on_after(_give_up_s(ideal_s, spread_s, limit)):
            async with trio.open_nursery() as nursery:
                for index, conversation in enumerate(conversations):
                    client = clients[index % len(clients)]
                    nursery.start_soon(_one_run, client, conversation, spread_s * index / runs, measured)
            completed = True
        sampler.cancel_scope.cancel(reason="the window ended")
    elapsed = time.perf_counter() - started
    cpu_after = [cpu_s(pid) for pid in pids]
    waits = [(runqueue_wait_s(pid) - before) / elapsed * 100 for pid, before in zip(pids, waits_before, strict=True)]
    client_cpu = cpu_s(os.getpid()) - client_cpu_before
    machine_after = machine_cpu_s()
    ours = sum(cpu_after) - sum(cpu_before) + client_cpu
    # Busy CPU of every other process on the machine (other users' builds on a shared machine), from /proc/stat
    # less ours; in % of one core, as ours.
    others_pct = max(0.0, (machine_after - machine_before - ours) / elapsed * 100)
    result: dict[str, Any] = {
        "runs": runs,
        "completed": completed,
        "completed_runs": len(measured.walls_s),
        "failed_runs": len(measured.failed),
        "window_s": round(elapsed, 2),
        "owner_cpu_pct": round((cpu_after[0] - cpu_before[0]) / elapsed * 100, 1),
        "worker_cpu_pct": [
            round((a - b) / elapsed * 100, 1) for a, b in zip(cpu_after[1:], cpu_before[1:], strict=True)
        ],
        "client_cpu_pct": round(client_cpu / elapsed * 100, 1),
        "owner_wait_pct": round(waits[0], 1),
        "worker_wait_pct": [round(wait, 1) for wait in waits[1:]],
        "others_cpu_pct": round(others_pct, 1),
        "owner_rss_mib": round(peaks[0]),
        "worker_rss_mib": [round(peak) for peak in peaks[1:]],
    }
    if measured.failed:
        result["failures"] = measured.failed[:5]
    if completed:  # every turn of every run was taken: the CPU per turn is known
        turns_done = runs * turns
        result["owner_cpu_ms_per_turn"] = round((cpu_after[0] - cpu_before[0]) / turns_done * 1000, 2)
        result["workers_cpu_ms_per_turn"] = round((sum(cpu_after[1:]) - sum(cpu_before[1:])) / turns_done * 1000, 2)
        result["client_cpu_ms_per_turn"] = round(client_cpu / turns_done * 1000, 2)
        result["commit_records_per_turn"] = round((commit_seq(db) - records_before) / turns_done, 2)
    if completed and not measured.failed:
        walls = [wall / ideal_s for wall in measured.walls_s]
        recorded = [wall / ideal_s for wall in measured.recorded_s]
        result.update(
            {
                "wall_p50_over_ideal": round(statistics.median(walls), 3),
                "wall_p99_over_ideal": round(_percentile(walls, 0.99), 3),
                "wall_max_over_ideal": round(max(walls), 3),
                "recorded_max_over_ideal": round(max(recorded), 3),
            }
        )
    return result


def _between(passed: int, failed: int) -> int | None:
    """The N halfway between the largest N within the limit and the smallest past it, or ``None`` once they are
    within a tenth of each other (or adjacent)."""
    if failed - passed <= max(1, passed // 10):
        return None
    return (passed + failed) // 2


def _give_up_s(ideal_s: float, spread_s: float, limit: float) -> float:
    return max(3.0, limit + 1) * ideal_s + spread_s + WINDOW_GRACE_S


def _within(window: dict[str, Any], limit: float) -> bool:
    return bool(window["completed"]) and not window["failed_runs"] and window["wall_max_over_ideal"] <= limit


async def measure(directory: str, args: argparse.Namespace) -> dict[str, Any]:
    """Each N of the ladder in turn on one owner and two workers, until one is past the limit or time is up."""
    db = os.path.join(directory, "capacity.db")
    env = bench_env(**{TURNS_ENV: str(args.turns), TURN_S_ENV: str(args.turn_s)})
    ideal_s = args.turns * args.turn_s
    deadline = time.monotonic() + args.deadline_s
    windows: list[dict[str, Any]] = []
    stopped = "the ladder ended"
    async with (
        owner_and_workers(db, env, args.max_leases, args.max_concurrent_runs) as served,
        contextlib.AsyncExitStack() as stack,
    ):
        clients = [
            await stack.enter_async_context(actors.connect(db=db, wait_for_owner_s=30)) for _ in range(args.connections)
        ]
        with trio.fail_after(60):
            await _wait_for_workers(clients[0])
            # Warm-up: four one-turn runs, spread over the workers by the owner's placement, before the first window.
            warm = await _conversations(clients[0], WARM_AGENT, 2 * WORKERS)
            submitted = [await clients[0].submit(c, kind="input", payload="go") for c in warm]
            for submission in submitted:
                assert submission.run_id is not None
                await clients[0].wait_for_run(submission.run_id)
        passed, failed, refined = 0, None, 0
        queue = list(args.ladder)
        while queue:
            runs = queue.pop(0)
            # The window's likely length (1.5x the limit's, and the conversations made before it), not its bound
            # (``_give_up_s``), so a slow step stops the ladder without every step paying for its worst case.
            needed_s = 1.5 * args.limit * ideal_s + args.spread_s + runs / 500
            if time.monotonic() + needed_s > deadline:
                stopped = f"--deadline-s {args.deadline_s:g} would pass before N={runs} ended"
                break
            window = await _window(db, served, clients, runs, args.turns, ideal_s, args.spread_s, args.limit)
            windows.append(window)
            if not args.json:
                _print_row(window, args.limit)
            if _within(window, args.limit):
                passed = max(passed, runs)
            else:
                failed = runs if failed is None else min(failed, runs)
                queue.clear()
            if failed is not None:
                stopped = f"N={failed} was past the limit"
                middle = _between(passed, failed)
                if middle is not None and refined < args.refine:
                    refined += 1
                    queue.append(middle)
                elif refined:
                    stopped += f" (refined {refined} time(s) between the last N within it and the first past it)"
            await trio.sleep(SETTLE_S)
    within = [window for window in windows if _within(window, args.limit)]
    best = max(within, key=lambda window: int(window["runs"])) if within else None
    past = sorted((window for window in windows if not _within(window, args.limit)), key=lambda w: int(w["runs"]))
    completed = [window for window in windows if window["completed"]]
    busiest = max(completed, key=lambda window: int(window["runs"])) if completed else None
    return {
        "what": f"agent runs of {args.turns} model turns x {args.turn_s:g} s, each turn one call of a trivial safe "
        f"tool, then a text answer at once; ideal wall time {ideal_s:g} s per run",
        "processes": f"one owner (tether owner --max-concurrent-runs {args.max_concurrent_runs}), {WORKERS} workers "
        f"(tether worker --max-leases {args.max_leases} each), this client over {args.connections} connection(s)",
        "submits": f"spread evenly over {args.spread_s:g} s" if args.spread_s > 0 else "all at once",
        "criterion": f"every run's wall time (submit to completion, as the client sees it) <= {args.limit:g} x ideal "
        "(the max)",
        "cpu_count": os.cpu_count(),
        "windows": windows,
        "stopped": stopped,
        "capacity_runs": best["runs"] if best else 0,
        "first_past_limit": past[0] if past else None,
        "at_capacity": best,
        "goal": f">= {GOAL_RUNS}",
        "goal_met": best is not None and best["runs"] >= GOAL_RUNS,
        "cpu_bound": _cpu_bound(busiest, args.turn_s) if busiest is not None else None,
    }


def _cpu_bound(window: dict[str, Any], turn_s: float) -> dict[str, Any]:
    """What the CPU per model turn measured at the largest N that completed would allow at most, queueing aside:
    the runs whose turns (one every ``turn_s``) one core of owner CPU serves, and those the machine's cores serve
    with the owner, the workers and the client together."""
    owner_ms = window["owner_cpu_ms_per_turn"]
    all_ms = owner_ms + window["workers_cpu_ms_per_turn"] + window["client_cpu_ms_per_turn"]
    cores = os.cpu_count() or 1
    return {
        "at_runs": window["runs"],
        "owner_cpu_ms_per_turn": owner_ms,
        "all_cpu_ms_per_turn": round(all_ms, 2),
        "owner_core_runs": round(1000 * turn_s / owner_ms),
        "machine_runs": round(cores * 1000 * turn_s / all_ms),
        "commit_records_per_turn": window["commit_records_per_turn"],
    }


HEADER: Final = (
    f"{'N':>6} {'p50':>6} {'p99':>6} {'max':>6} {'owner':>6} {'workers CPU %':>14} {'client':>7} {'others':>7} "
    f"{'owner waits %':>13} "
    f"{'owner':>6} {'workers RSS':>12}  verdict"
)


def _print_header(args: argparse.Namespace) -> None:
    ideal_s = args.turns * args.turn_s
    print(
        f"capacity: agent runs of {args.turns} model turns x {args.turn_s:g} s, each turn one call of a trivial tool, "
        f"then a text answer at once (ideal wall time {ideal_s:g} s per run)"
    )
    print(
        f"one owner (--max-concurrent-runs {args.max_concurrent_runs:,}), {WORKERS} workers (--max-leases "
        f"{args.max_leases:,} each; the defaults, 64 busy runs and 64 leases a worker, would bound N at 64), one "
        f"client process over {args.connections} connection(s); submits spread over {args.spread_s:g} s; "
        f"{os.cpu_count()} CPUs"
    )
    print(
        f"wall time per run from its submit to its completion, over the ideal (p50, p99, max); criterion: max <= "
        f"{args.limit:g}; CPU in % of one core over the window (others: every other process on the machine); owner "
        "waits: the time its main thread was runnable but had no core, in % of the window; peak RSS in MiB"
    )
    print(HEADER)


def _print_row(window: dict[str, Any], limit: float) -> None:
    workers_cpu = " / ".join(f"{pct:.0f}" for pct in window["worker_cpu_pct"])
    workers_rss = " / ".join(str(mib) for mib in window["worker_rss_mib"])
    if not window["completed"]:
        ratios, verdict = f"{'-':>6} {'-':>6} {'-':>6}", f"not completed in {window['window_s']:.0f} s"
    elif window["failed_runs"]:
        ratios, verdict = f"{'-':>6} {'-':>6} {'-':>6}", f"{window['failed_runs']} runs failed"
    else:
        ratios = " ".join(
            f"{window[key]:>6.2f}" for key in ("wall_p50_over_ideal", "wall_p99_over_ideal", "wall_max_over_ideal")
        )
        verdict = "within" if window["wall_max_over_ideal"] <= limit else "PAST the limit"
    print(
        f"{window['runs']:>6} {ratios} {window['owner_cpu_pct']:>6.0f} {workers_cpu:>14} "
        f"{window['client_cpu_pct']:>7.0f} {window['others_cpu_pct']:>7.0f} {window['owner_wait_pct']:>13.0f} "
        f"{window['owner_rss_mib']:>6} "
        f"{workers_rss:>12}  {verdict}",
        flush=True,
    )


def _print_summary(results: dict[str, Any]) -> None:
    print(f"stopped: {results['stopped']}")
    best = results["at_capacity"]
    if best is None:
        print("capacity: no N of the ladder stayed within the limit")
    else:
        _print_best(best, results["first_past_limit"])
    verdict = "met" if results["goal_met"] else "not met"
    print(f"goal {results['goal']}: {verdict}")
    bound = results["cpu_bound"]
    if bound is not None:
        print(
            f"CPU per tool turn (its model turn and tool call, with its share of the run's submit and answer) at "
            f"N={bound['at_runs']:,}: owner {bound['owner_cpu_ms_per_turn']} ms, owner + workers + client "
            f"{bound['all_cpu_ms_per_turn']} ms; at that cost one core of owner serves at most "
            f"~{bound['owner_core_runs']:,} runs, the machine's {results['cpu_count']} cores "
            f"~{bound['machine_runs']:,} (if nothing else ran; queueing aside); {bound['commit_records_per_turn']} "
            "commit-log records per turn"
        )


def _print_best(best: dict[str, Any], past: dict[str, Any] | None) -> None:
    workers_cpu = ", ".join(f"{pct:.0f} %" for pct in best["worker_cpu_pct"])
    workers_rss = ", ".join(f"{mib} MiB" for mib in best["worker_rss_mib"])
    print(
        f"capacity: {best['runs']:,} concurrent runs within the limit (max {best['wall_max_over_ideal']:.2f} x "
        f"ideal, p50 {best['wall_p50_over_ideal']:.2f}); there the owner used {best['owner_cpu_pct']:.0f} % of a "
        f"core (and waited for one {best['owner_wait_pct']:.0f} % of the time) and {best['owner_rss_mib']} MiB, the "
        f"workers {workers_cpu} and {workers_rss}"
    )
    if past is not None:
        how = f"max {past['wall_max_over_ideal']:.2f} x ideal" if "wall_max_over_ideal" in past else "not completed"
        print(f"the smallest N past the limit: {past['runs']:,} ({how})")


def _ladder(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of run counts, not {text!r}") from None
    if not values or any(value < 1 for value in values) or list(values) != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"run counts of 1 or more, increasing, not {text!r}")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0]
        + " One owner and two workers; runs of 10 model turns of 1 s, each calling a trivial tool; N grows along a "
        "ladder until the slowest run takes more than 1.2x its ideal (10 s). Prints a table per N (wall time over "
        "ideal, CPU and RSS of each process) and the largest N within the limit.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (and no table)")
    parser.add_argument(
        "--ladder",
        type=_ladder,
        default=LADDER,
        help=f"the concurrent runs to try, in order (default {','.join(map(str, LADDER))})",
    )
    parser.add_argument("--turns", type=int, default=10, help="model turns per run, each calling the tool once (10)")
    parser.add_argument("--turn-s", type=float, default=1.0, help="the model's time per turn, seconds (1.0)")
    parser.add_argument(
        "--limit", type=float, default=1.2, help="the slowest run's wall time over ideal, at most (1.2)"
    )
    parser.add_argument(
        "--spread-s",
        type=float,
        default=None,
        help="submit the N runs evenly over S seconds (default one turn; 0: all at once)",
    )
    parser.add_argument("--connections", type=int, default=4, help="client connections the runs are spread over (4)")
    parser.add_argument("--max-leases", type=int, default=20_000, help="each worker's --max-leases (20000)")
    parser.add_argument(
        "--max-concurrent-runs", type=int, default=100_000, help="the owner's --max-concurrent-runs (100000)"
    )
    parser.add_argument(
        "--refine",
        type=int,
        default=3,
        help="after the first N past the limit, try up to this many N halfway between it and the last within (3)",
    )
    parser.add_argument(
        "--deadline-s", type=float, default=900.0, help="no new N is started that would end past this (900)"
    )
    args = parser.parse_args()
    if args.spread_s is None:
        args.spread_s = args.turn_s
    if args.turns < 1 or not args.turn_s > 0 or not args.limit >= 1 or args.spread_s < 0 or args.connections < 1:
        parser.error("--turns and --connections must be 1 or more, --turn-s positive, --limit >= 1, --spread-s >= 0")
    if not args.json:
        _print_header(args)
    with tempfile.TemporaryDirectory(prefix="tether-bench-capacity-") as directory:
        results = trio.run(measure, directory, args)
    if args.json:
        print(json.dumps(results))
    else:
        _print_summary(results)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
