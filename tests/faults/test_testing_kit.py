"""The test kit itself (``actors.testing``, docs/testing.md): the scratch owner and its fixtures, each crash point of
a worker process and of the owner doing what it says, the journal assertions failing when they should, clear errors
for bad input, and every process reaped (the autouse guard of tests/conftest.py fails a test that leaves one)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Final

import pytest
import trio

import actors
from actors import testing
from actors.testing import OwnerKill, ScratchOwner, WorkerKill, WorkerProcess
from tests.faults import _kit_apps
from tests.integration._agent_apps import read_ledger
from tests.integration._agent_helpers import ledger
from tests.integration._up_helpers import ROOT

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 30
APP: Final = "tests.faults._kit_apps:safe"


def attempts(ledger: Path) -> list[int]:
    return [line["attempt"] for line in read_ledger(ledger) if line["tool"] == "lookup"]


async def test_the_fixtures_give_an_owner_on_the_manual_clock(
    tether_owner: ScratchOwner, tether_client: actors.Client
) -> None:
    with trio.fail_after(TIMEOUT_S):
        assert tether_owner.running and tether_owner.clock == "manual"
        welcome = tether_client.welcome
        assert welcome is not None and welcome.clock == "manual"
        now_ms = await tether_owner.advance_clock(1000)
        assert await tether_client.advance_clock(500) == now_ms + 500
        with pytest.raises(actors.UsageError, match="is running: stop or kill it first"):
            await tether_owner.start()
        assert await tether_owner.kill() == -signal.SIGKILL
        await tether_owner.start()  # restartable on the same database
        assert await tether_client.advance_clock(0) >= now_ms + 500  # the clock is durable too


# ------------------------------------------------------------------------------------ a worker's crash points

# (the kill, the journal when the worker is dead, the lookup's executions then, and at the end)
WORKER_POINTS: Final = {
    "before_commit": (WorkerKill("before_commit"), [], [], [1]),
    "after_intent": (
        WorkerKill("after_intent", kind="tool", name="lookup"),
        [("model", "scripted", "completed", 1), ("tool", "lookup", "interrupted", 1)],
        [],
        [2],
    ),
    "before_result": (
        WorkerKill("before_result", kind="tool"),
        [("model", "scripted", "completed", 1), ("tool", "lookup", "interrupted", 1)],
        [1],
        [1, 2],
    ),
    "after_result": (
        WorkerKill("after_result", 2),
        [("model", "scripted", "completed", 1), ("tool", "lookup", "completed", 1)],
        [1],
        [1],
    ),
}


@pytest.mark.parametrize("point", list(WORKER_POINTS))
async def test_a_worker_process_dies_at_its_point_and_another_worker_finishes_the_run(
    tether_owner: ScratchOwner, tether_client: actors.Client, ledger: Path, point: str
) -> None:
    kill, at_death, ran_at_death, ran = WORKER_POINTS[point]
    with trio.fail_after(TIMEOUT_S):
        async with WorkerProcess(tether_owner.db, APP, kill=kill, cwd=ROOT) as worker:
            conversation_id, run_id = await testing.start_run(tether_client, "support", "Where is A1?")
            await worker.killed()
        assert "fault injection: SIGKILL at" in worker.log_text()
        await testing.wait_for_status(tether_client, run_id, "pending", "running")  # its lease ended with it
        assert await testing.journal(tether_client, run_id) == at_death
        assert attempts(ledger) == ran_at_death
        async with testing.served(tether_owner.db, _kit_apps.safe):
            run = await tether_client.wait_for_run(run_id)
        assert run.status == "completed"
        assert attempts(ledger) == ran
        await testing.assert_transcript_whole(tether_client, conversation_id)
        await testing.assert_nothing_open(tether_client, run_id)
        if ran == [1]:
            await testing.assert_ran_once(tether_client, run_id, tool="lookup")
        else:
            with pytest.raises(AssertionError, match="not completed at its first"):
                await testing.assert_ran_once(tether_client, run_id, tool="lookup")


async def test_a_worker_that_never_reaches_its_point_fails_the_wait_and_is_reaped(tether_owner: ScratchOwner) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with WorkerProcess(tether_owner.db, APP, kill=WorkerKill("after_commit"), cwd=ROOT) as worker:
            with pytest.raises(AssertionError, match=r"did not reach its kill point after_commit:1 within 0\.2 s"):
                await worker.killed(timeout_s=0.2)  # no run: nothing is committed
            assert not worker.running


async def test_a_worker_process_that_cannot_load_its_app_says_so(tether_owner: ScratchOwner) -> None:
    with trio.fail_after(TIMEOUT_S):
        worker = WorkerProcess(tether_owner.db, "tests.faults._kit_apps:missing", cwd=ROOT)
        with pytest.raises(AssertionError, match=r"exit status 2 before serving; its log ends: .*missing"):
            await worker.start()
        assert not worker.running
    with pytest.raises(actors.UsageError, match="MODULE:ATTR"):
        WorkerProcess(tether_owner.db, "myagent")
    with pytest.raises(actors.UsageError, match=r"an actors\.WorkerKill"):
        WorkerProcess(tether_owner.db, APP, kill="after_intent:1")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ the owner's points


async def test_an_owner_killed_right_after_committing_a_result_keeps_it(tether_db: str, ledger: Path) -> None:
    owner = ScratchOwner(tether_db)
    try:
        with trio.fail_after(TIMEOUT_S):
            await owner.start(kill=OwnerKill("after_result", 2))  # the lookup's result: stored, never acknowledged
            async with testing.serving(tether_db, _kit_apps.safe) as client:
                conversation_id, run_id = await testing.start_run(client, "support", "Where is A1?")
                await owner.killed()
                await owner.start()
                run = await client.wait_for_run(run_id)
                assert run.status == "completed"
                await testing.assert_ran_once(client, run_id, tool="lookup")
                assert attempts(ledger) == [1]
                assert await testing.journal(client, run_id) == [
                    ("model", "scripted", "completed", 1),
                    ("tool", "lookup", "completed", 1),
                    ("model", "scripted", "completed", 1),
                ]
                await testing.assert_transcript_whole(client, conversation_id)
    finally:
        await owner.aclose()


async def test_an_owner_that_never_reaches_its_point_fails_the_wait_and_is_reaped(tether_db: str) -> None:
    async with ScratchOwner(tether_db) as owner:
        with trio.fail_after(TIMEOUT_S):
            await owner.aclose()
            await owner.start(kill=OwnerKill("before_result", 1))
            with pytest.raises(AssertionError, match=r"did not reach its kill point within 0\.2 s"):
                await owner.killed(timeout_s=0.2)
            assert not owner.running


async def test_bad_input_to_the_owner_says_what_is_wrong(tether_db: str) -> None:
    with pytest.raises(actors.UsageError, match="one of before_commit, after_commit, before_result, after_result"):
        OwnerKill("mid_tool")  # type: ignore[arg-type]
    with pytest.raises(actors.UsageError, match="counts from 1"):
        OwnerKill("after_result", 0)
    with pytest.raises(actors.UsageError, match="'manual' or 'wall'"):
        ScratchOwner(tether_db, clock="fast")  # type: ignore[arg-type]
    with pytest.raises(actors.UsageError, match="was never started"):
        await ScratchOwner(tether_db).kill()
    with trio.fail_after(TIMEOUT_S):
        async with ScratchOwner(tether_db, clock="wall") as owner:
            with pytest.raises(actors.UsageError, match="runs on the wall clock"):
                await owner.advance_clock(1)
        with pytest.raises(actors.OwnerUnavailable, match="exited with status 2 before listening; its log"):
            await ScratchOwner(tether_db, "--no-such-flag").start()


def test_recorded_transcripts_are_named() -> None:
    assert "openai_tool_calls" in testing.TRANSCRIPTS
    assert testing.recorded_transcript("openai_text").startswith(b"data: ")
    with pytest.raises(actors.UsageError, match="the recorded ones: llamacpp_text"):
        testing.recorded_transcript("gpt-9")


async def test_a_kill_not_awaited_fails_the_next_call_at_once_saying_so(tether_owner: ScratchOwner) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with WorkerProcess(tether_owner.db, APP, cwd=ROOT) as worker:
            pending = worker.kill()  # the misuse: not awaited, nothing is killed
            assert worker.running
            started = trio.current_time()
            with pytest.raises(actors.UsageError, match=r"worker\.kill\(\) was not awaited.*await worker\.kill\(\)"):
                await worker.killed()
            assert trio.current_time() - started < 5  # not the 30 s wait for a death that never comes
            assert worker.running
            with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
                await pending  # reported, it was closed: it never kills later
        async with WorkerProcess(tether_owner.db, APP, cwd=ROOT) as worker:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.kill)  # run by trio: a kill like any awaited one
                await worker.killed()
            assert not worker.running
        owner = ScratchOwner(tether_owner.db)
        await tether_owner.stop()
        await owner.start()
        owner.kill()  # the misuse again, on an owner
        with pytest.raises(actors.UsageError, match=r"owner\.kill\(\) was not awaited"):
            await owner.stop()
        assert owner.running
        assert await owner.kill() == -signal.SIGKILL  # the report settled the first: a new kill, awaited
        await owner.aclose()
