"""Tasks against a real owner process: sleeps across owner restarts, blocked and migrated tasks, the background
boundary, ``completing``, ``abandon_on_restart``, orphaning, and the ``tether tasks`` / ``tether abort`` commands.

Workers run in this process (``actors.serve`` under the test's nursery) unless the scenario is about a worker
process, in which case ``tether worker --app tests.integration._task_apps:ATTR`` runs. Every phase appends a line to
a run log (see ``_task_apps``) before it commits, so a test sees how often a phase really ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

import trio
import trio.testing

import actors
from protocol import JsonValue
from runtime import stop_gracefully, tether_command
from storage_owner.core import ORPHAN_GRACE_MS
from tests.conftest import OwnerProcess
from tests.integration import _task_apps
from tests.integration._task_apps import FAR_MS, VERSIONED_KINDS, read_runs
from tests.integration._up_helpers import CHILD_ENV, ROOT, nonblank_lines, run_tether

T = TypeVar("T")

APPS: Final = "tests.integration._task_apps"
POLL_S: Final = 0.02
ORPHAN_GRACE_S: Final = ORPHAN_GRACE_MS / 1000


# ------------------------------------------------------------------------------------------------ helpers


async def eventually(read: Callable[[], Awaitable[T]], predicate: Callable[[T], bool]) -> T:
    """Poll ``read()`` until ``predicate`` holds for what it returns (bounded by the caller's deadline). A read cut
    off by an owner restart is asked again."""
    while True:
        try:
            value = await read()
        except actors.ConnectionLost:
            continue
        if predicate(value):
            return value
        await trio.sleep(POLL_S)


async def task_in(client: actors.Client, task_id: str, *statuses: str) -> actors.TaskRecord:
    """The task's record once its status is one of ``statuses``."""
    return await eventually(partial(client.task, task_id), lambda record: record.status in statuses)


async def attached(client: actors.Client, name: str) -> None:
    """Wait until a worker named ``name`` is attached to the owner and has announced what it runs."""
    await eventually(client.peers, lambda peers: any(p.peer_name == name and p.announced for p in peers))


async def start_worker(nursery: trio.Nursery, app: actors.App, db: str, name: str) -> trio.CancelScope:
    """Serve ``app`` in this process as worker ``name``; returns once it announced. Cancel the scope to stop it."""
    scope = trio.CancelScope()

    async def run(*, task_status: trio.TaskStatus[actors.Client]) -> None:
        with scope:
            await actors.serve(app, db=db, name=name, task_status=task_status)

    await nursery.start(run)
    return scope


async def stop_worker(client: actors.Client, scope: trio.CancelScope, name: str) -> None:
    """Stop an in-process worker and wait until the owner saw its connection end."""
    scope.cancel(reason=f"the test stops worker {name}")
    await eventually(client.peers, lambda peers: all(peer.peer_name != name for peer in peers))


@contextlib.asynccontextmanager
async def worker_process(db: str, attribute: str, name: str) -> AsyncIterator[trio.Process]:
    """``tether worker --db DB --app tests.integration._task_apps:ATTRIBUTE --name NAME``, reaped on exit."""
    command = tether_command("worker", "--db", db, "--app", f"{APPS}:{attribute}", "--name", name)
    process = await trio.lowlevel.open_process(command, cwd=ROOT, env=CHILD_ENV, stdout=subprocess.DEVNULL)
    try:
        yield process
    finally:
        await stop_gracefully(process)


def runs_of(log: Path, task_id: str) -> list[str]:
    """What ran of ``task_id``, in order: phase names (and ``abort`` for its abort handler)."""
    return [line["run"] for line in read_runs(log) if line["task"] == task_id]


async def ran(log: Path, task_id: str, runs: list[str]) -> None:
    """Wait until exactly ``runs`` of ``task_id`` were logged (a phase logs before it commits: poll the file)."""

    async def read() -> list[str]:
        await trio.lowlevel.checkpoint()
        return runs_of(log, task_id)

    await eventually(read, lambda found: found == runs)


def owned_by(graph: actors.TaskGraph, owner_task_id: str) -> list[str]:
    return [task_id for task_id, node in graph.nodes.items() if node.task.owner_task_id == owner_task_id]


def completed(result: Any) -> actors.TaskOutcome:
    return actors.TaskOutcome(status="completed", result=JsonValue(result))


def aborted(result: Any, *, reason: str | None = None) -> actors.TaskOutcome:
    return actors.TaskOutcome(status="aborted", reason=reason, result=JsonValue(result))


# ---------------------------------------------------------------------------------------------- sleeping


async def test_a_sleep_survives_an_owner_restart_and_wakes_exactly_at_its_deadline(
    manual_owner: OwnerProcess, tmp_path: Path
) -> None:
    db = manual_owner.db
    log = tmp_path / "runs.jsonl"
    with trio.fail_after(40):
        async with actors.connect(db=db) as client, worker_process(db, "app", "sleepy"):
            await attached(client, "sleepy")
            start_ms = (await client.ping()).now_ms
            until_ms = start_ms + 10_000
            task_id = await client.create_task("tt.sleeper", {"until_ms": until_ms, "log": str(log)})
            record = await task_in(client, task_id, "sleeping")
            assert record.until_ms == until_ms

            assert await client.advance_clock(5_000) == start_ms + 5_000
            assert (await client.task(task_id)).status == "sleeping"

            await manual_owner.kill()
            await manual_owner.start()
            await attached(client, "sleepy")  # the worker found the new owner by itself
            assert (await client.ping()).now_ms == start_ms + 5_000  # the manual clock's time was stored
            record = await client.task(task_id)
            assert (record.status, record.until_ms, record.restarts) == ("sleeping", until_ms, 0)

            assert await client.advance_clock(4_999) == until_ms - 1
            assert (await client.task(task_id)).status == "sleeping"
            assert runs_of(log, task_id) == ["start"]

            assert await client.advance_clock(1) == until_ms
            assert (await client.task(task_id)).status != "sleeping"  # woken by the commit that moved the clock
            done = await client.wait_for_task(task_id)
        assert done.outcome == completed({"woke_at_ms": until_ms})
        assert runs_of(log, task_id) == ["start", "wake"]


async def test_a_deadline_that_passed_while_the_owner_was_down_wakes_the_task_once(
    owner: OwnerProcess, tmp_path: Path
) -> None:
    # Wall clock: the point is that real time passes the deadline while no owner runs.
    db = owner.db
    log = tmp_path / "runs.jsonl"
    with trio.fail_after(30):
        async with actors.connect(db=db) as client, trio.open_nursery() as nursery:
            await start_worker(nursery, _task_apps.app, db, "worker")
            until_ms = (await client.ping()).now_ms + 2_000
            task_id = await client.create_task("tt.sleeper", {"until_ms": until_ms, "log": str(log)})
            await task_in(client, task_id, "sleeping")
            await owner.kill()
            assert time.time_ns() // 1_000_000 < until_ms, "the test machine is too slow: the task woke already"
            await trio.sleep((until_ms - time.time_ns() // 1_000_000) / 1000 + 0.05)
            await owner.start()
            done = await client.wait_for_task(task_id)
            nursery.cancel_scope.cancel(reason="the test is over")
    assert done.outcome is not None and done.outcome.status == "completed"
    result: Any = done.outcome.result
    assert result["woke_at_ms"] >= until_ms
    assert done.restarts == 0
    assert runs_of(log, task_id) == ["start", "wake"]


# ----------------------------------------------------------------------------------------------- blocked


async def test_a_task_of_a_kind_no_worker_has_is_blocked_until_one_attaches(
    owner: OwnerProcess, tmp_path: Path
) -> None:
    db = owner.db
    log = tmp_path / "runs.jsonl"
    with trio.fail_after(30):
        async with actors.connect(db=db) as client, trio.open_nursery() as nursery:
            await start_worker(nursery, _task_apps.app, db, "main")
            late = await client.create_task("tt.late", {"log": str(log)})
            graph = await eventually(client.task_graph, lambda graph: graph.nodes[late].blocked is not None)
            node = graph.nodes[late]
            assert (node.blocked, node.task.status, node.task.version) == ("missing_task", "pending", 0)
            assert node.blocked_detail is not None and "tt.late" in node.blocked_detail
            assert node.leased_to is None
            assert runs_of(log, late) == []

            await start_worker(nursery, _task_apps.late_app, db, "late")
            done = await client.wait_for_task(late)
            assert done.outcome == completed({"late": True})
            assert done.version == 1
            assert runs_of(log, late) == ["start"]
            nursery.cancel_scope.cancel(reason="the test is over")


async def test_a_task_is_blocked_missing_task_while_no_worker_at_all_is_attached(owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=owner.db) as client:
            task_id = await client.create_task("tt.late")
            graph = await eventually(client.task_graph, lambda graph: graph.nodes[task_id].blocked is not None)
            node = graph.nodes[task_id]
            assert node.task.status == "pending"
            assert node.blocked == "missing_task"


async def test_aborting_a_blocked_task_orphans_it_once_the_owner_grace_is_over(manual_owner: OwnerProcess) -> None:
    """The grace runs on the owner's clock: a manual clock that does not move keeps the task waiting for a worker;
    advancing it to the grace's end orphans the task (the owner wakes for that end itself)."""
    db_path = manual_owner.db
    with trio.fail_after(20):
        async with actors.connect(db=db_path) as client, trio.open_nursery() as nursery:
            started_ms = (await client.ping()).now_ms  # the clock has not moved since the owner started
            await start_worker(nursery, _task_apps.app, db_path, "main")
            task_id = await client.create_task("tt.nobody")
            await eventually(client.task_graph, lambda graph: graph.nodes[task_id].blocked == "missing_task")
            assert await client.abort_task(task_id)
            await client.advance_clock(ORPHAN_GRACE_MS - 1)
            node = (await client.task_graph()).nodes[task_id]
            assert (node.task.status, node.task.abort, node.blocked) == ("pending", "abort", "missing_task")

            assert await client.advance_clock(1) == started_ms + ORPHAN_GRACE_MS
            done = await client.wait_for_task(task_id)
            assert done.outcome is not None
            assert (done.outcome.status, done.outcome.reason) == ("orphaned", "missing_task")
            assert done.outcome.error is not None and "tt.nobody" in done.outcome.error
            assert done.updated_at_ms == started_ms + ORPHAN_GRACE_MS
            assert task_id not in (await client.task_graph()).nodes
            nursery.cancel_scope.cancel(reason="the test is over")


async def test_versions_too_old_migrated_and_failed_migrations(manual_owner: OwnerProcess, tmp_path: Path) -> None:
    db = manual_owner.db
    log = tmp_path / "runs.jsonl"
    with trio.fail_after(30):
        async with actors.connect(db=db) as client, trio.open_nursery() as nursery:
            v1 = await start_worker(nursery, _task_apps.app_v1, db, "v1")
            until_ms = (await client.ping()).now_ms + 1_000
            tasks = {
                kind: await client.create_task(kind, {"until_ms": until_ms, "log": str(log)})
                for kind in VERSIONED_KINDS
            }
            for task_id in tasks.values():
                record = await task_in(client, task_id, "sleeping")
                assert record.version == 1  # the version-1 worker ran its first phase: bound to version 1

            await start_worker(nursery, _task_apps.app_v2, db, "v2")
            too_new = await client.create_task("tt.mig", {"log": str(log)}, version=3)
            graph = await eventually(client.task_graph, lambda graph: graph.nodes[too_new].blocked is not None)
            node = graph.nodes[too_new]
            assert (node.blocked, node.task.status, node.task.version) == ("task_too_old", "pending", 3)
            assert node.blocked_detail is not None and "version 3" in node.blocked_detail

            await stop_worker(client, v1, "v1")
            for task_id in tasks.values():
                record = await client.task(task_id)
                assert (record.status, record.version) == ("sleeping", 1)
            await client.advance_clock(1_000)

            migrated = await client.wait_for_task(tasks["tt.mig"])
            assert migrated.outcome == completed(
                {"version": 2, "checkpoint": {"phase": "next_v2", "n": 1, "migrated_from": 1}}
            )
            assert migrated.version == 2
            assert runs_of(log, tasks["tt.mig"]) == ["start", "next_v2"]

            graph = await eventually(
                client.task_graph,
                lambda graph: all(graph.nodes[tasks[kind]].blocked is not None for kind in ("tt.nomig", "tt.badmig")),
            )
            no_migrate = graph.nodes[tasks["tt.nomig"]]
            assert (no_migrate.blocked, no_migrate.task.status, no_migrate.task.version) == (
                "migration_failed",
                "pending",
                1,
            )
            assert no_migrate.blocked_detail is not None and "migrate" in no_migrate.blocked_detail
            bad_migrate = graph.nodes[tasks["tt.badmig"]]
            assert (bad_migrate.blocked, bad_migrate.task.status, bad_migrate.task.version) == (
                "migration_failed",
                "pending",
                1,
            )
            assert bad_migrate.blocked_detail is not None
            assert "cannot migrate checkpoint n=1 from version 1" in bad_migrate.blocked_detail
            assert graph.nodes[too_new].blocked == "task_too_old"
            for kind in ("tt.nomig", "tt.badmig"):
                assert runs_of(log, tasks[kind]) == ["start"]  # no phase of version 2 ran on them
            nursery.cancel_scope.cancel(reason="the test is over")


# ------------------------------------------------------------------------------- ownership and outcomes


async def test_aborting_a_parent_does_not_abort_its_background_child(
    manual_owner: OwnerProcess, tmp_path: Path
) -> None:
    db = manual_owner.db
    log = tmp_path / "runs.jsonl"
    with trio.fail_after(30):
        async with actors.connect(db=db) as client, trio.open_nursery() as nursery:
            await start_worker(nursery, _task_apps.app, db, "main")
            child_until_ms = (await client.ping()).now_ms + 1_000
            parent = await client.create_task(
                "tt.parent", {"background": True, "child_until_ms": child_until_ms, "log": str(log)}
            )
            [child] = (await task_in(client, parent, "waiting")).on
            record = await task_in(client, child, "sleeping")
            assert (record.owner_task_id, record.background) == (parent, True)

            assert await client.abort_task(parent)
            done = await client.wait_for_task(parent)
            # The abort handler ran while the child still lived: the parent did not wait for it.
            assert done.outcome == aborted({"abort": "abort", "child": None})
            record = await client.task(child)
            assert (record.status, record.abort) == ("sleeping", None)

            await client.advance_clock(1_000)
            child_done = await client.wait_for_task(child)
            assert child_done.outcome == completed({"child": "done"})
            assert runs_of(log, parent) == ["start", "abort"]
            assert runs_of(log, child) == ["start", "finish"]

            # Nor does a background child keep its owner from ending: completed at once, not completing.
            finisher = await client.create_task("tt.finisher", {"background": True, "log": str(log)})
            done = await client.wait_for_task(finisher)
            assert (done.outcome, done.held) == (completed({"finished": True}), None)
            [child] = owned_by(await client.task_graph(), finisher)
            record = await task_in(client, child, "sleeping", "terminal")  # its first phase may still be running
            assert (record.status, record.background, record.abort) == ("sleeping", True, None)
            nursery.cancel_scope.cancel(reason="the test is over")


async def test_a_task_that_completes_while_its_child_runs_is_completing_until_the_child_ends(
    manual_owner: OwnerProcess, tmp_path: Path
) -> None:
    db = manual_owner.db
    log = tmp_path / "runs.jsonl"
    with trio.fail_after(30):
        async with actors.connect(db=db) as client, trio.open_nursery() as nursery:
            await start_worker(nursery, _task_apps.app, db, "main")
            child_until_ms = (await client.ping()).now_ms + 1_000
            finisher = await client.create_task("tt.finisher", {"child_until_ms": child_until_ms, "log": str(log)})
            record = await task_in(client, finisher, "completing")
            assert (record.held, record.outcome) == (completed({"finished": True}), None)
            graph = await client.task_graph()
            assert graph.nodes[finisher].task.status == "completing"
            assert graph.nodes[finisher].task.held == completed({"finished": True})
            [child] = owned_by(graph, finisher)
            await task_in(client, child, "sleeping")

            waited: list[actors.TaskRecord] = []

            async def wait_for_finisher() -> None:
                waited.append(await client.wait_for_task(finisher))

            nursery.start_soon(wait_for_finisher)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            await client.ping()  # the wait was asked before this round trip
            assert waited == []

            await client.advance_clock(1_000)
            child_done = await client.wait_for_task(child)
            assert child_done.outcome == completed({"child": "done"})
            await eventually(partial(trio.sleep, 0), lambda _: bool(waited))
            [done] = waited
            assert (done.status, done.outcome, done.held) == ("terminal", completed({"finished": True}), None)
            assert done.seq > child_done.seq  # released by a commit after the child's end
            assert runs_of(log, finisher) == ["start"]

            # A held outcome other than completed aborts the work still running, then is released.
            failing = await client.create_task("tt.finisher", {"fail": True, "log": str(log)})
            done = await client.wait_for_task(failing)
            assert done.outcome == actors.TaskOutcome(status="failed", error="the finisher failed")
            [child] = [line["task"] for line in read_runs(log) if line["kind"] == "tt.child" and line["run"] == "abort"]
            child_done = await client.task(child)
            assert (child_done.owner_task_id, child_done.status) == (failing, "terminal")
            assert child_done.outcome == aborted({"abort": "abort"})
            assert done.seq > child_done.seq
            nursery.cancel_scope.cancel(reason="the test is over")


async def test_abandon_on_restart_aborts_a_live_task_and_its_child_after_an_owner_restart(
    manual_owner: OwnerProcess, tmp_path: Path
) -> None:
    db = manual_owner.db
    log = tmp_path / "runs.jsonl"
    with trio.fail_after(40):
        async with actors.connect(db=db) as client, trio.open_nursery() as nursery:
            await start_worker(nursery, _task_apps.app, db, "main")
            task_input = {"child_until_ms": (await client.ping()).now_ms + 1_000, "log": str(log)}
            abandoned = await client.create_task("tt.parent", task_input, abandon_on_restart=True)
            normal = await client.create_task("tt.parent", task_input)
            abandoned_blocked = await client.create_task("tt.nobody", abandon_on_restart=True)
            await start_worker(nursery, _task_apps.hang_app, db, "hanger")
            abandoned_running = await client.create_task("tt.hang", {"log": str(log)}, abandon_on_restart=True)
            normal_running = await client.create_task("tt.hang", {"log": str(log)})
            for task_id in (abandoned_running, normal_running):
                await task_in(client, task_id, "running")
                await ran(log, task_id, ["start"])
            [abandoned_child] = (await task_in(client, abandoned, "waiting")).on
            [normal_child] = (await task_in(client, normal, "waiting")).on
            await task_in(client, abandoned_child, "sleeping")
            await task_in(client, normal_child, "sleeping")

            await manual_owner.kill()
            await manual_owner.start()

            done = await client.wait_for_task(abandoned)
            assert done.outcome == aborted({"abort": "restart", "child": "aborted"}, reason="restart")
            child_record = await client.task(abandoned_child)
            assert child_record.outcome == aborted({"abort": "restart"}, reason="restart")
            assert runs_of(log, abandoned) == ["start", "abort"]
            assert runs_of(log, abandoned_child) == ["start", "abort"]
            # Running when the owner died: cut off, then aborted (tt.hang has no abort handler).
            done = await client.wait_for_task(abandoned_running)
            assert done.outcome == aborted(None, reason="restart")
            assert runs_of(log, abandoned_running) == ["start"]
            # A normal task running then just runs its phase again, one restart counted.
            await ran(log, normal_running, ["start", "start"])
            record = await client.task(normal_running)
            assert (record.status, record.abort, record.restarts) == ("running", None, 1)

            record = await client.task(normal)
            assert (record.status, record.abort, record.restarts) == ("waiting", None, 0)
            record = await client.task(normal_child)
            assert (record.status, record.abort) == ("sleeping", None)
            await attached(client, "main")
            await client.advance_clock(1_000)
            normal_done = await client.wait_for_task(normal)
            assert normal_done.outcome == completed({"child": "completed"})
            assert runs_of(log, normal) == ["start", "collect"]
            assert runs_of(log, normal_child) == ["start", "finish"]

            # Abandoned work nobody can run waits for a worker (its abort handler may still clean up), even once the
            # owner's orphan grace is over; an explicit abort replaces the restart mark and orphans it.
            await client.advance_clock(ORPHAN_GRACE_MS)
            node = (await client.task_graph()).nodes[abandoned_blocked]
            assert (node.task.status, node.task.abort, node.blocked) == ("pending", "restart", "missing_task")
            assert await client.abort_task(abandoned_blocked)
            done = await client.wait_for_task(abandoned_blocked)
            assert done.outcome is not None
            assert (done.outcome.status, done.outcome.reason) == ("orphaned", "missing_task")
            nursery.cancel_scope.cancel(reason="the test is over")


async def test_an_abort_mark_on_a_sleeping_task_survives_an_owner_restart(
    manual_owner: OwnerProcess, tmp_path: Path
) -> None:
    """A sleeping task marked for abort while no worker could run its handler (within the orphan grace) is still
    handled once a worker attaches after the next owner restart, long before its deadline."""
    db = manual_owner.db
    log = tmp_path / "runs.jsonl"
    with trio.fail_after(30):
        async with actors.connect(db=db) as client, trio.open_nursery() as nursery:
            worker = await start_worker(nursery, _task_apps.app, db, "main")
            task_id = await client.create_task("tt.child", {"log": str(log)})  # sleeps until FAR_MS
            await task_in(client, task_id, "sleeping")
            await stop_worker(client, worker, "main")

            await manual_owner.kill()
            await manual_owner.start()
            started_s = trio.current_time()
            assert await client.abort_task(task_id)
            node = (await client.task_graph()).nodes[task_id]
            assert trio.current_time() - started_s < ORPHAN_GRACE_S, "too slow: the orphan grace was over"
            assert (node.task.status, node.task.abort, node.blocked) == ("sleeping", "abort", "missing_task")

            await manual_owner.kill()
            await manual_owner.start()
            await start_worker(nursery, _task_apps.app, db, "main")
            with trio.move_on_after(ORPHAN_GRACE_S + 2):
                await client.wait_for_task(task_id)
            record = await client.task(task_id)
            assert (record.status, record.outcome) == ("terminal", aborted({"abort": "abort"}))
            assert runs_of(log, task_id) == ["start", "abort"]
            nursery.cancel_scope.cancel(reason="the test is over")


# --------------------------------------------------------------------------------------------------- CLI


async def test_tether_tasks_and_tether_abort(manual_owner: OwnerProcess, tmp_path: Path) -> None:
    db = manual_owner.db
    log = tmp_path / "runs.jsonl"
    with trio.fail_after(60):
        async with actors.connect(db=db) as client, trio.open_nursery() as nursery:
            await start_worker(nursery, _task_apps.app, db, "main")
            hang_worker = await start_worker(nursery, _task_apps.hang_app, db, "hanger")
            conversation = await client.create_conversation()
            parent = await client.create_task("tt.parent", {"log": str(log)}, conversation_id=conversation)
            hung = await client.create_task("tt.hang", {"log": str(log)}, conversation_id=conversation)
            nobody = await client.create_task("tt.nobody", conversation_id=conversation)
            [child] = (await task_in(client, parent, "waiting")).on
            await task_in(client, child, "sleeping")
            await task_in(client, hung, "running")
            await ran(log, hung, ["start"])
            await stop_worker(client, hang_worker, "hanger")  # its phase was cut off: one restart
            graph = await eventually(
                client.task_graph,
                lambda graph: graph.nodes[hung].blocked is not None and graph.nodes[nobody].blocked is not None,
            )

            result = await run_tether("tasks", "--db", db)
            assert result.returncode == 0, result.stderr
            lines = nonblank_lines(result.stdout)
            assert lines[0] == f"4 live task(s) in {os.path.abspath(db)} as of seq {graph.seq}"
            assert lines[1] == f"conversation {conversation}"  # one conversation: every task below it
            parent_line = lines.index(f"  tt.parent {parent[-8:]}, waiting on 1 (all_settled)")
            assert lines[parent_line + 1] == f"    tt.child {child[-8:]}, sleeping until {FAR_MS}"
            assert (
                f"  tt.hang {hung[-8:]}, pending, restarts 1/5, "  # no phase: its first one never committed
                "BLOCKED missing_task: no attached worker has task kind tt.hang"
            ) in lines
            assert (
                f"  tt.nobody {nobody[-8:]}, pending, BLOCKED missing_task: no attached worker has task kind tt.nobody"
            ) in lines

            result = await run_tether("tasks", "--db", db, "--json")
            assert result.returncode == 0, result.stderr
            data = json.loads(result.stdout)
            assert set(data) == {"db", "seq", "source", "tasks"}
            assert (data["db"], data["seq"], data["source"]) == (os.path.abspath(db), graph.seq, "owner")
            tasks = {task["task_id"]: task for task in data["tasks"]}
            assert set(tasks) == {parent, child, hung, nobody}
            expected = {
                parent: {
                    "kind": "tt.parent",
                    "version": 1,
                    "status": "waiting",
                    "owner": {"conversation": conversation},
                },
                child: {"kind": "tt.child", "version": 1, "status": "sleeping", "owner": {"task": parent}},
                hung: {"kind": "tt.hang", "version": 1, "status": "pending", "restarts": 1, "blocked": "missing_task"},
                nobody: {"kind": "tt.nobody", "version": 0, "status": "pending", "blocked": "missing_task"},
            }
            for task_id, fields in expected.items():
                shown = tasks[task_id]
                defaults = {"restarts": 0, "blocked": None, "outcome": None, "owner": {"conversation": conversation}}
                for name, value in (defaults | fields).items():
                    assert shown[name] == value, (task_id, name, shown)
            assert tasks[parent]["on"] == [child]
            assert tasks[child]["until_ms"] == FAR_MS

            result = await run_tether("abort", "--db", db, nobody)
            assert (result.returncode, nonblank_lines(result.stdout)) == (0, [f"task {nobody}: marked for abort"])
            await client.advance_clock(ORPHAN_GRACE_MS)  # the owner's orphan grace ends on its (manual) clock
            result = await run_tether("abort", "--db", db, nobody, "--wait", "10")
            assert (result.returncode, nonblank_lines(result.stdout)) == (
                0,
                [f"task {nobody}: already marked for abort, or terminal", f"task {nobody}: orphaned (missing_task)"],
            )
            result = await run_tether("abort", "--db", db, parent, "--wait", "10")
            assert (result.returncode, nonblank_lines(result.stdout)) == (
                0,
                [f"task {parent}: marked for abort", f"task {parent}: aborted"],
            )
            assert (await client.task(parent)).outcome == aborted({"abort": "abort", "child": "aborted"})
            assert runs_of(log, child) == ["start", "abort"]

            result = await run_tether("abort", "--db", db, parent)
            assert (result.returncode, nonblank_lines(result.stdout)) == (
                0,
                [f"task {parent}: already marked for abort, or terminal"],
            )

            unknown = actors.new_id()
            result = await run_tether("abort", "--db", db, unknown)
            assert result.returncode == 1
            assert result.stdout == b""
            [error] = nonblank_lines(result.stderr)
            assert unknown in error
            nursery.cancel_scope.cancel(reason="the owner stops next")

        # No owner: SIGKILLed, its runtime file left behind naming a port nobody listens on.
        await manual_owner.kill()
        result = await run_tether("tasks", "--db", db, "--json")
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["source"] == "database"
        [task] = data["tasks"]
        assert (task["task_id"], task["status"], task["restarts"], task["blocked"]) == (hung, "pending", 1, None)
        result = await run_tether("tasks", "--db", db)
        assert result.returncode == 0, result.stderr
        lines = nonblank_lines(result.stdout)
        assert lines[1].startswith("(no owner is running")
        assert f"  tt.hang {hung[-8:]}, pending, restarts 1/5" in lines

        # A new owner shows the task blocked again (no worker attached), and orphans it when aborted.
        await manual_owner.start()
        result = await run_tether("tasks", "--db", db, "--json")
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        assert data["source"] == "owner"
        [task] = data["tasks"]
        assert (task["task_id"], task["status"], task["restarts"], task["blocked"]) == (
            hung,
            "pending",
            1,
            "missing_task",
        )
        async with actors.connect(db=db) as client:
            await client.advance_clock(ORPHAN_GRACE_MS)  # the new owner's orphan grace ends on its (manual) clock
        result = await run_tether("abort", "--db", db, hung, "--wait", "10")
        assert (result.returncode, nonblank_lines(result.stdout)) == (
            0,
            [f"task {hung}: marked for abort", f"task {hung}: orphaned (missing_task)"],
        )


async def test_the_watched_task_graph_follows_creation_waits_aborts_and_ends(
    owner: OwnerProcess, tmp_path: Path
) -> None:
    log = tmp_path / "runs.jsonl"
    with trio.fail_after(30):
        async with actors.connect(db=owner.db) as client, trio.open_nursery() as nursery:
            await start_worker(nursery, _task_apps.app, owner.db, "main")
            graphs: list[actors.TaskGraph] = []
            parent_id: str | None = None
            async for graph in client.watch_task_graph():
                graphs.append(graph)
                if parent_id is None:
                    assert graph.nodes == {}  # nothing live before the test starts
                    # The child sleeps past any wall-clock time this test sees (FAR_MS is for manual clocks).
                    parent_id = await client.create_task("tt.parent", {"log": str(log), "child_until_ms": 1 << 50})
                    continue
                parent = graph.nodes.get(parent_id)
                children = [node for node in graph.nodes.values() if node.task.owner_task_id == parent_id]
                waiting = parent is not None and parent.task.status == "waiting" and parent.task.abort is None
                if waiting and children and children[0].task.status == "sleeping":
                    # The parent waits on its child, which the watch shows asleep under it: abort the parent.
                    assert parent is not None and parent.task.on == (children[0].task.task_id,)
                    await client.abort_task(parent_id)
                if not graph.nodes:
                    break
            seqs = [graph.seq for graph in graphs]
            assert seqs == sorted(seqs)
            seen = [
                (node.task.kind, node.task.status, node.task.abort) for graph in graphs for node in graph.nodes.values()
            ]
            assert ("tt.parent", "waiting", "abort") in seen  # the mark, committed before anything ended
            assert any(kind == "tt.child" and abort == "abort" for kind, _, abort in seen)  # cascaded to the child
            assert parent_id is not None
            ended = await client.wait_for_task(parent_id)
            assert ended.outcome is not None and ended.outcome.status == "aborted"
            # Bottom-up: the child's abort handler ran, then its parent's.
            aborts = [(run["kind"], run["run"]) for run in _task_apps.read_runs(log) if run["run"] == "abort"]
            assert aborts == [("tt.child", "abort"), ("tt.parent", "abort")]
            nursery.cancel_scope.cancel(reason="the test is over")
