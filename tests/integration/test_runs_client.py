"""The client's runs API against a real owner (``--clock manual``) and no worker: submissions start runs that stay
``pending`` (no worker takes their task) or ``queued`` behind them; cancel, retry, waits and listings."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

import actors
from storage_owner.core import ORPHAN_GRACE_MS
from tests.conftest import OwnerProcess
from tests.integration._up_helpers import run_tether

PAST_GRACE_MS = ORPHAN_GRACE_MS + 1
"""With no worker, a cancelled pending run's task ends ``orphaned`` (its abort handler cannot run: the run is
``failed``, reason ``orphaned``) once the orphan grace is over on the owner's clock."""
ORPHANED = ("failed", "orphaned")


async def pending_run(client: actors.Client) -> str:
    """A run submitted to a new conversation of agent ``support``, which no worker serves: its id."""
    conversation_id = await client.create_conversation(agent="support")
    submission = await client.submit(conversation_id, kind="input", payload="1", request_id="r-1")
    assert submission.run_id is not None
    return submission.run_id


async def wait_into(client: actors.Client, run_id: str, result: list[actors.RunRecord]) -> None:
    """Append the run's record to ``result`` once it settles (``wait_for_run``)."""
    result.append(await client.wait_for_run(run_id))


async def test_an_input_starts_a_pending_run_and_the_next_one_is_queued(manual_owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=manual_owner.db) as client:
            conversation_id = await client.create_conversation(agent="support")
            assert (await client.conversation(conversation_id)).agent == "support"
            first = await client.submit(conversation_id, kind="input", payload="hello", request_id="r-1")
            second = await client.submit(conversation_id, kind="input", payload="again", request_id="r-2")
            assert first.run_id is not None and second.run_id is not None
            run = await client.run(first.run_id)
            assert (run.status, run.agent, run.conversation_id) == ("pending", "support", conversation_id)
            assert (await client.run(second.run_id)).status == "queued"
            assert run.usage == actors.RunUsage() and run.answer is None
            assert await client.operations(first.run_id) == []
            assert await client.interactions() == []
            assert await client.usage(conversation_id) == {}


async def test_a_repeated_request_id_returns_the_same_run(manual_owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=manual_owner.db) as client:
            conversation_id = await client.create_conversation(agent="support")
            first = await client.submit(conversation_id, kind="input", payload="hello", request_id="r-1")
            again = await client.submit(conversation_id, kind="input", payload="hello", request_id="r-1")
            # The original as it is now: its run was admitted in the batch of the first submit, so it is placed.
            assert (again.submission_id, again.run_id, again.status) == (first.submission_id, first.run_id, "placed")
            with pytest.raises(actors.Conflict):
                await client.submit(conversation_id, kind="input", payload="other", request_id="r-1")
            assert [run.run_id for run in await client.runs(conversation_id=conversation_id)] == [first.run_id]


async def test_when_busy_reject_is_refused_while_a_run_is_active(manual_owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=manual_owner.db) as client:
            conversation_id = await client.create_conversation(agent="support")
            await client.submit(conversation_id, kind="input", payload="one", request_id="r-1", when_busy="reject")
            with pytest.raises(actors.Conflict):
                await client.submit(conversation_id, kind="input", payload="two", request_id="r-2", when_busy="reject")
            assert len(await client.runs(conversation_id=conversation_id)) == 1
            assert await client.submission(conversation_id, "r-2") is None


async def test_runs_lists_by_conversation_and_status(manual_owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=manual_owner.db) as client:
            a = await client.create_conversation(agent="support")
            b = await client.create_conversation(agent="triage")
            a1 = await client.submit(a, kind="input", payload="1", request_id="r-1")
            a2 = await client.submit(a, kind="input", payload="2", request_id="r-2")
            b1 = await client.submit(b, kind="input", payload="1", request_id="r-1")
            everything = [run.run_id for run in await client.runs()]
            assert everything == [a1.run_id, a2.run_id, b1.run_id]
            assert [run.run_id for run in await client.runs(conversation_id=b)] == [b1.run_id]
            assert [run.run_id for run in await client.runs(status="queued")] == [a2.run_id]
            assert [run.run_id for run in await client.runs(conversation_id=a, status="pending")] == [a1.run_id]
            with pytest.raises(actors.NotFound):
                await client.run(actors.new_id())


async def test_runs_are_listed_in_the_order_they_were_created_not_by_id(manual_owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=manual_owner.db) as client:
            a = await client.create_conversation(agent="support")
            b = await client.create_conversation(agent="support")
            # Ids that sort against the order of submission, as a subagent's derived (uuid5) run id does.
            ids = sorted((actors.new_id() for _ in range(3)), reverse=True)
            created = []
            for conversation_id, submission_id in zip((a, b, a), ids, strict=True):
                submitted = await client.submit(
                    conversation_id, kind="input", payload="hi", submission_id=submission_id
                )
                created.append(submitted.run_id)
            assert [run.run_id for run in await client.runs()] == created
            assert [run.run_id async for run in client.iter_runs(conversation_id=a)] == [created[0], created[2]]
            listed = await run_tether("runs", "--db", manual_owner.db, "--json")
            assert listed.returncode == 0, listed.stderr
            assert [run["run_id"] for run in json.loads(listed.stdout)["runs"]] == created


async def test_cancel_a_queued_run_and_a_pending_one_nobody_can_run_which_ends_orphaned(
    manual_owner: OwnerProcess,
) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=manual_owner.db) as client:
            conversation_id = await client.create_conversation(agent="support")
            pending = await client.submit(conversation_id, kind="input", payload="1", request_id="r-1")
            queued = await client.submit(conversation_id, kind="input", payload="2", request_id="r-2")
            after = await client.submit(conversation_id, kind="input", payload="3", request_id="r-3")
            assert pending.run_id is not None and queued.run_id is not None and after.run_id is not None
            assert (await client.cancel_run(queued.run_id)).status == "cancelled"
            assert (await client.run(queued.run_id)).status == "cancelled"
            marked = await client.cancel_run(pending.run_id)  # its task is marked for abort, kept for a worker
            assert (marked.status, marked.reason) == ("pending", "cancelling")
            await client.advance_clock(PAST_GRACE_MS)
            # No worker came to run its abort handler: its task was orphaned, and the run says so.
            orphaned = await client.wait_for_run(pending.run_id)
            assert (orphaned.status, orphaned.reason) == ORPHANED
            assert orphaned.error == (
                "the run's task was orphaned (missing_task): no attached worker has task kind agent:support"
            )
            settled = await client.wait_for_submission(pending.submission_id)
            assert (settled.status, settled.reason) == ("unanswered", "missing_task")
            # Someone aborted it: it holds nothing behind it, the next run was admitted at once.
            assert ((await client.run(after.run_id)).status, (await client.run(after.run_id)).reason) == (
                "pending",
                "agent_missing",
            )
            with pytest.raises(actors.Conflict):
                await client.cancel_run(pending.run_id)  # it ended failed: nothing to cancel
            with pytest.raises(actors.Conflict):
                await client.retry(queued.run_id)
            assert (await client.run(queued.run_id)).status == "cancelled"


async def test_wait_for_run_ends_when_the_run_is_cancelled(manual_owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=manual_owner.db) as client:
            run_id = await pending_run(client)
            result: list[actors.RunRecord] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_into, client, run_id, result)
                await trio.testing.wait_all_tasks_blocked()
                assert result == []
                await client.cancel_run(run_id)
                await trio.testing.wait_all_tasks_blocked()
                assert result == []
                await client.advance_clock(PAST_GRACE_MS)
            assert [(run.status, run.reason) for run in result] == [ORPHANED]


async def test_a_closed_clients_wait_for_run_fails_at_a_checkpoint(manual_owner: OwnerProcess) -> None:
    with trio.fail_after(20):
        async with actors.connect(db=manual_owner.db) as client:
            run_id = await pending_run(client)
        with pytest.raises(actors.ConnectionLost):
            await client.wait_for_run(run_id)
        with pytest.raises(actors.ConnectionLost):
            await client.runs()
        with trio.CancelScope() as scope:
            scope.cancel(reason="a closed client's calls are still checkpoints")
            await client.wait_for_run(run_id)
        assert scope.cancelled_caught


async def test_wait_for_run_survives_an_owner_restart(manual_owner: OwnerProcess) -> None:
    with trio.fail_after(30):
        async with actors.connect(db=manual_owner.db) as client:
            run_id = await pending_run(client)
            result: list[actors.RunRecord] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_into, client, run_id, result)
                await trio.testing.wait_all_tasks_blocked()
                await manual_owner.kill()
                await manual_owner.start()
                while True:
                    try:
                        await client.cancel_run(run_id)
                        await client.advance_clock(PAST_GRACE_MS)
                        break
                    except actors.Conflict:
                        break  # a cancel and an advance landed, their replies lost: the run ended (failed)
                    except actors.ConnectionLost:
                        await trio.sleep(0.02)  # the cancel's reply was lost with the old connection: ask again
            assert [(run.status, run.reason) for run in result] == [ORPHANED]
