"""A short soak: an owner and two workers (supervised by the test, restarted at once), mixed load from this process
(appends, task trees, sleeping tasks, agent runs whose safe tool writes a ledger), SIGKILLs of the owner and of
workers at random moments; then an independent checker reads the database file with the standard library's
``sqlite3`` (none of the owner's code) and checks what the load recorded against it.

Seeded: the seed is printed, and named in any failure; ``TETHER_SOAK_SEED`` replays a kill schedule. A long local
run: ``TETHER_SOAK_KILLS=200 TETHER_SOAK_WORKER_KILLS=50 .venv/bin/pytest -q -s --timeout 0 tests/faults/test_soak.py``
(docs/operations.md, "A long soak").
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import attrs
import msgpack
import trio

import actors
from runtime import kill_and_reap, stop_gracefully, tether_command
from tests.conftest import OwnerProcess
from tests.faults import _soak_app
from tests.integration._up_helpers import CHILD_ENV, ROOT

APP: Final = "tests.faults._soak_app:app"
OWNER_KILLS: Final = int(os.environ.get("TETHER_SOAK_KILLS", "20"))
WORKER_KILLS: Final = int(os.environ.get("TETHER_SOAK_WORKER_KILLS", "5"))
WORKERS: Final = 2
APPENDERS: Final = 4
AGENT_CONVERSATIONS: Final = 3
QUICK_KILLS: Final = 0.25
"""The share of kills that come right after the previous one, without waiting for the load to make progress."""
WAL_BOUND_BYTES: Final = 32 << 20
"""The WAL's bound under sustained writes (docs/operations.md, "The WAL's bound": 2,000 pages, about 8 MB, plus what
commits while one checkpoint runs; tests/integration/test_checkpoints.py holds it to the same 32 MB)."""
LONG_NAP_MS: Final = 3_600_000
TERMINAL_RUN: Final = ("completed", "failed", "cancelled")
LIVE_TASK: Final = ("pending", "running", "waiting", "sleeping", "completing")
CLIENT_LOST: Final = (actors.ConnectionLost, actors.OwnerUnavailable)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


@attrs.define
class Load:
    """What the load generators sent and what the owner acknowledged: the source of truth for the checker."""

    db: str
    stop: trio.Event = attrs.Factory(trio.Event)
    attempted: set[str] = attrs.Factory(set)
    acked: dict[str, int] = attrs.Factory(dict)
    """Acknowledged entry id -> the seq acknowledged (0: confirmed by ``Duplicate`` on a retry)."""
    trees: set[str] = attrs.Factory(set)
    runs: dict[str, str] = attrs.Factory(dict)
    """Acknowledged request id -> run id."""
    retries: int = 0
    reconnects: int = 0
    progress: int = 0

    async def resilient(self, body: Callable[[actors.Client], Awaitable[None]], on_lost: Callable[[], None]) -> None:
        """Run ``body`` on a client until it returns, with a new client each time one is lost for good."""
        while True:
            try:
                async with actors.connect(db=self.db, wait_for_owner_s=30) as client:
                    await body(client)
                    return
            except BaseException as exc:
                if not all(isinstance(leaf, CLIENT_LOST) for leaf in _leaves(exc)):
                    raise
                self.reconnects += 1
                on_lost()
                await trio.sleep(0.05)

    async def appender(self, conversation_id: str, index: int) -> None:
        pending: list[Any] = [None, False]  # entry id, retried

        async def body(client: actors.Client) -> None:
            n = 0
            while True:
                if pending[0] is None:
                    if self.stop.is_set():
                        return
                    n += 1
                    entry_id = actors.new_id()
                    pending[:] = [entry_id, False]
                    self.attempted.add(entry_id)
                try:
                    seq = await client.append(conversation_id, kind="soak.note", data=[index, n], entry_id=pending[0])
                except CLIENT_LOST:
                    pending[1] = True
                    self.retries += 1
                    await trio.sleep(0.02)
                    continue
                except actors.Duplicate:
                    if not pending[1]:
                        raise
                    seq = 0
                self.acked[pending[0]] = seq
                self.progress += 1
                pending[:] = [None, False]

        await self.resilient(body, lambda: pending.__setitem__(1, True))

    async def tasker(self, conversation_id: str, rng: random.Random) -> None:
        pending: list[Any] = [None, False]

        async def body(client: actors.Client) -> None:
            while True:
                if pending[0] is None:
                    if self.stop.is_set():
                        return
                    await trio.sleep(0.1)
                    pending[:] = [actors.new_id(), False]
                try:
                    tree_input = {"children": rng.randint(1, 3), "steps": rng.randint(1, 3), "step_s": 0.05}
                    await client.create_task(
                        _soak_app.TREE, tree_input, conversation_id=conversation_id, task_id=pending[0]
                    )
                except CLIENT_LOST:
                    pending[1] = True
                    await trio.sleep(0.02)
                    continue
                except actors.Duplicate:
                    if not pending[1]:
                        raise
                self.trees.add(pending[0])
                pending[:] = [None, False]

        await self.resilient(body, lambda: pending.__setitem__(1, True))

    async def submitter(self, conversations: list[str]) -> None:
        pending: list[Any] = [None, 0]  # request id, submissions so far

        async def body(client: actors.Client) -> None:
            while True:
                if pending[0] is None:
                    if self.stop.is_set():
                        return
                    await trio.sleep(0.3)
                    pending[:] = [actors.new_id(), pending[1] + 1]
                conversation_id = conversations[pending[1] % len(conversations)]
                try:
                    # A repeat of the same request id returns the first submission: a retry is safe.
                    record = await client.submit(
                        conversation_id, kind="input", payload="write two lines", request_id=pending[0]
                    )
                except CLIENT_LOST:
                    await trio.sleep(0.02)
                    continue
                assert record.run_id is not None
                self.runs[pending[0]] = record.run_id
                pending[0] = None

        await self.resilient(body, lambda: None)


@attrs.define(eq=False)
class Workers:
    """``tether worker`` processes the test supervises: one killed is started again at once."""

    db: str
    directory: Path
    env: dict[str, str]
    processes: list[trio.Process] = attrs.Factory(list)
    started: int = 0

    async def start(self, slot: int) -> None:
        self.started += 1
        with open(self.directory / f"worker-{self.started}.stderr", "wb") as stderr:
            process = await trio.lowlevel.open_process(
                tether_command("worker", "--db", self.db, "--app", APP, "--name", f"soak-{slot}"),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=ROOT,
                env=self.env,
            )
        if slot < len(self.processes):
            self.processes[slot] = process
        else:
            self.processes.append(process)

    async def kill_and_restart(self, slot: int) -> int:
        status = await kill_and_reap(self.processes[slot], signal.SIGKILL)
        await self.start(slot)
        return status

    async def close(self) -> list[int]:
        return [await stop_gracefully(process) for process in self.processes]


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


async def wait_progress(load: Load, than: int, owner: OwnerProcess, *, timeout_s: float = 30.0) -> None:
    """Wait until the appenders had more than ``than`` acknowledgements (the owner is back and serving)."""
    with trio.fail_after(timeout_s):
        while load.progress <= than:
            assert owner.process is not None and owner.process.poll() is None, "the owner died by itself"
            await trio.sleep(0.01)


async def test_soak_sigkills_owner_and_workers_under_mixed_load(db_path: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("TETHER_SOAK_SEED", random.SystemRandom().randrange(2**32)))
    print(f"soak seed {seed} (TETHER_SOAK_SEED={seed} replays it): {OWNER_KILLS} owner and {WORKER_KILLS} worker kills")
    try:
        await _soak(db_path, tmp_path, random.Random(seed))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n(soak seed {seed}: TETHER_SOAK_SEED={seed} replays it)") from exc


async def _soak(db_path: str, tmp_path: Path, rng: random.Random) -> None:
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    owner = OwnerProcess(db_path)
    workers = Workers(db_path, tmp_path, {**CHILD_ENV, "TETHER_SOAK_LEDGER": str(ledger)})
    load = Load(db_path)
    schedule = ["owner"] * OWNER_KILLS + ["worker"] * WORKER_KILLS
    rng.shuffle(schedule)
    wal_samples: list[int] = []
    owner_statuses: list[int] = []
    worker_statuses: list[int] = []
    try:
        with trio.fail_after(120 + 4 * len(schedule)):
            await owner.start()
            for slot in range(WORKERS):
                await workers.start(slot)
            async with actors.connect(db=db_path) as client:
                notes = await client.create_conversation()
                trees = await client.create_conversation()
                agents = [await client.create_conversation(agent=_soak_app.AGENT) for _ in range(AGENT_CONVERSATIONS)]
                long_nap = await client.create_task(_soak_app.NAP, {"ms": LONG_NAP_MS}, conversation_id=trees)
                short_nap = await client.create_task(_soak_app.NAP, {"ms": 500}, conversation_id=trees)

            async with trio.open_nursery() as nursery:
                for index in range(APPENDERS):
                    nursery.start_soon(load.appender, notes, index)
                nursery.start_soon(load.tasker, trees, random.Random(rng.random()))
                nursery.start_soon(load.submitter, agents)
                await wait_progress(load, 50, owner)
                for victim in schedule:
                    if rng.random() < QUICK_KILLS:
                        # Right after the last restart: the owner recovering, workers and clients reattaching.
                        await trio.sleep(rng.uniform(0.0, 0.05))
                    else:
                        await wait_progress(load, load.progress + 20, owner)
                        await trio.sleep(rng.uniform(0.0, 0.5))
                    wal_samples.append(file_size(db_path + "-wal"))
                    if victim == "owner":
                        owner_statuses.append(await owner.kill())
                        await owner.start()
                    else:
                        worker_statuses.append(await workers.kill_and_restart(rng.randrange(WORKERS)))
                await wait_progress(load, load.progress + 50, owner)
                load.stop.set()

            # Everything the load started must end by itself: the workers and the owner are whole again.
            async with actors.connect(db=db_path, wait_for_owner_s=30) as client:
                with trio.fail_after(90 + len(schedule)):
                    trees_done = [await client.wait_for_task(task_id) for task_id in sorted(load.trees)]
                    await client.wait_for_task(short_nap)
                    runs_done = [await client.wait_for_run(run_id) for run_id in sorted(load.runs.values())]
                    # A worker restarted by the last kill may still be starting (its SIGTERM handler not yet set): it
                    # is whole again once it has announced, and only then is it stopped.
                    names = {f"soak-{slot}" for slot in range(WORKERS)}
                    while True:
                        if names <= {peer.peer_name for peer in await client.peers() if peer.announced}:
                            break
                        await trio.sleep(0.02)
                wal_samples.append(file_size(db_path + "-wal"))
                db_bytes = file_size(db_path)
            assert await workers.close() == [0] * WORKERS
            assert await owner.stop() == 0
    finally:
        await workers.close()
        await owner.close()

    tree_outcomes = Counter(record.outcome.status for record in trees_done if record.outcome is not None)
    run_statuses = Counter(run.status for run in runs_done)
    print(
        f"acked {len(load.acked)} appends ({load.retries} retried, {load.reconnects} clients replaced), "
        f"{len(load.trees)} task trees {dict(tree_outcomes)}, {len(load.runs)} runs {dict(run_statuses)}"
    )
    print(
        f"database {db_bytes / 2**20:.1f} MiB; WAL at most {max(wal_samples) / 2**20:.1f} MiB over "
        f"{len(wal_samples)} samples (bound {WAL_BOUND_BYTES >> 20} MiB)"
    )
    assert owner_statuses == [-signal.SIGKILL] * OWNER_KILLS
    assert worker_statuses == [-signal.SIGKILL] * WORKER_KILLS
    assert len(load.acked) > 200 and load.trees and load.runs, "the load barely ran: the soak proves little"
    assert max(wal_samples) <= WAL_BOUND_BYTES, f"the WAL grew to {max(wal_samples)} bytes"
    # Runs and trees survive the kills: a run may fail only past its restart limit, which 25 kills spread over
    # many commits do not reach; a tree completes once its leaves settled, however they ended.
    assert set(tree_outcomes) <= {"completed"}, tree_outcomes
    assert set(run_statuses) <= {"completed"}, [(run.run_id, run.status, run.reason) for run in runs_done]

    check_database_file(db_path, load, ledger, live={long_nap})


# ---------------------------------------------------------------------------------------------- the checker


def _unpack(blob: bytes | None) -> Any:
    return None if blob is None else msgpack.unpackb(blob, raw=False)


def check_database_file(db: str, load: Load, ledger: Path, *, live: set[str]) -> None:
    """Check the database file against what the load recorded, with ``sqlite3`` alone: every acknowledged append
    stored exactly once, no entry nobody sent, no live task without a reason (and exactly ``live`` live), every
    completed run's tool calls answered in its transcript, integrity ok."""
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        [(integrity,)] = connection.execute("PRAGMA integrity_check").fetchall()
        assert integrity == "ok", integrity
        seqs = [seq for (seq,) in connection.execute("SELECT seq FROM commits ORDER BY seq")]
        assert seqs == list(range(1, len(seqs) + 1)), "the commit log skips or repeats a seq"

        # Appends: each acknowledged one exactly once, with its acknowledged seq; nothing nobody sent.
        stored = connection.execute("SELECT entry_id, seq FROM entries WHERE kind = 'soak.note'").fetchall()
        counts = Counter(entry_id for entry_id, _ in stored)
        assert not [entry_id for entry_id, count in counts.items() if count > 1], "an entry is stored twice"
        stored_seq = dict(stored)
        missing = set(load.acked) - set(stored_seq)
        assert not missing, f"{len(missing)} acknowledged appends are lost: {sorted(missing)[:5]}"
        assert set(stored_seq) <= load.attempted, "entries nobody sent are stored"
        wrong = [entry_id for entry_id, seq in load.acked.items() if seq not in (0, stored_seq[entry_id])]
        assert not wrong, f"acknowledged under another seq than stored: {wrong[:5]}"
        positions = connection.execute(
            "SELECT conversation_id, COUNT(*), MIN(position), MAX(position) FROM entries GROUP BY conversation_id"
        ).fetchall()
        assert all((low, high) == (0, count - 1) for _, count, low, high in positions), "transcript positions gap"

        check_tasks(connection, load, live)
        check_runs(connection, load, ledger)
    finally:
        connection.close()


def check_tasks(connection: sqlite3.Connection, load: Load, live: set[str]) -> None:
    rows = connection.execute(
        "SELECT task_id, kind, status, owner_task_id, background, on_ids, until_ms, outcome FROM tasks"
    ).fetchall()
    tasks = {row[0]: row for row in rows}
    status = {task_id: row[2] for task_id, row in tasks.items()}
    assert load.trees <= set(tasks), "an acknowledged task is missing"
    kinds = {_soak_app.TREE, _soak_app.LEAF, _soak_app.NAP} | {k for k in {row[1] for row in rows} if ":" in k}
    for task_id, kind, state, owner_task_id, background, on_ids, until_ms, outcome in rows:
        assert kind in kinds or kind.startswith("tether."), f"task {task_id} of an unknown kind {kind}"
        if state == "terminal":
            assert _unpack(outcome) is not None, f"terminal task {task_id} without an outcome"
            continue
        assert state in LIVE_TASK, f"task {task_id} in unknown state {state}"
        # A reason to be live: its owner is live (or it is a background task), and it waits on something live,
        # sleeps until a time, or is runnable.
        if owner_task_id is not None and not background:
            assert status.get(owner_task_id) in LIVE_TASK, f"live task {task_id} owned by an ended task"
        if state == "waiting":
            waited = _unpack(on_ids) or []
            assert any(status.get(other) in LIVE_TASK for other in waited), f"task {task_id} waits on nothing live"
        elif state == "sleeping":
            assert until_ms is not None, f"task {task_id} sleeps without a deadline"
        elif state == "completing":
            assert any(row[3] == task_id and row[2] in LIVE_TASK for row in rows), f"{task_id} completes on nothing"
    still_live = {task_id for task_id, state in status.items() if state != "terminal"}
    assert still_live == live, f"tasks stuck live: {[(t, status[t], tasks[t][1]) for t in still_live - live]}"
    assert status[next(iter(live))] == "sleeping"


def check_runs(connection: sqlite3.Connection, load: Load, ledger: Path) -> None:
    runs = {
        run_id: (conversation_id, state, _unpack(answer))
        for run_id, conversation_id, state, answer in connection.execute(
            "SELECT run_id, conversation_id, status, answer FROM runs"
        )
    }
    assert set(load.runs.values()) <= set(runs), "an acknowledged run is missing"
    submissions = Counter(row[0] for row in connection.execute("SELECT submission_id FROM runs"))
    assert all(count == 1 for count in submissions.values()), "a submission started two runs"
    executed = {json.loads(line)["operation_id"] for line in ledger.read_text().splitlines() if line.strip()}
    transcripts: dict[str, list[tuple[str, Any]]] = {}
    for conversation_id, kind, data in connection.execute(
        "SELECT conversation_id, kind, data FROM entries WHERE kind LIKE 'tether.%' ORDER BY conversation_id, position"
    ):
        transcripts.setdefault(conversation_id, []).append((kind, _unpack(data)))
    for run_id, (conversation_id, state, answer) in runs.items():
        assert state in TERMINAL_RUN, f"run {run_id} still {state}"
        if state != "completed":
            continue
        entries = [(kind, data) for kind, data in transcripts.get(conversation_id, []) if data.get("run_id") == run_id]
        calls = [call for kind, data in entries if kind == "tether.assistant" for call in data["tool_calls"]]
        results = Counter(data["call_id"] for kind, data in entries if kind == "tether.tool_result")
        assert len(calls) == 2, f"run {run_id}: {len(calls)} tool calls in its transcript"
        for call in calls:
            assert results[call["call_id"]] == 1, f"run {run_id}: call {call['call_id']} has {results} results"
        answered = [data for kind, data in entries if kind == "tether.tool_result"]
        assert all(not data["is_error"] for data in answered), f"run {run_id}: a tool call failed: {answered}"
        assert {data["operation_id"] for data in answered} <= executed, f"run {run_id}: a result without a ledger line"
        assert answer is not None and answer["text"] == _soak_app.ANSWER, f"run {run_id} answered {answer}"
