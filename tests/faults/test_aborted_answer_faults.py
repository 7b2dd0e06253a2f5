"""An interrupted partial answer is kept: a worker SIGKILLed while its model streams, after some text went to the
owner; a second worker that dies right after committing the next attempt's intent (which carries the entry); and a
third worker finishing the run. The transcript then holds one ``tether.aborted_answer`` entry, with the text the
cut-off attempt had streamed, before the answer that replaced it (none for the attempt that streamed nothing, and
never the first one twice), and no request was sent it (docs/agents.md, "Partial output"; docs/runs.md, "Partial
output")."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import trio

import actors
from actors.testing import WorkerKill, WorkerProcess
from protocol import aborted_answer_entry_id
from tests.conftest import OwnerProcess
from tests.integration._agent_apps import STREAMED_ANSWER, build_streaming, read_requests
from tests.integration._agent_helpers import (
    AGENT_APPS,
    kill_mid_stream,
    ledger,
    run_in,
    serving,
    start_run,
)
from tests.integration._up_helpers import ROOT

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 60


async def test_the_text_a_killed_worker_had_streamed_is_kept_as_an_aborted_entry_the_model_is_never_sent(
    manual_owner: OwnerProcess, ledger: Path
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(manual_owner.db) as client:
            conversation_id, run_id = await start_run(client)
            await kill_mid_stream(client, manual_owner.db, run_id, "streaming_slow_recorded", ledger)
            await run_in(client, run_id, "retry_wait")
            [cut] = (await client.partials(run_id=run_id)).partials
            assert (cut.attempt, cut.status) == (1, "aborted") and STREAMED_ANSWER.startswith(cut.text)
            assert [entry.kind for entry in await client.entries(conversation_id)] == ["tether.user"]

            # A second worker commits attempt 2's intent, with the aborted entry of attempt 1, and dies right after:
            # attempt 2 streamed nothing (no entry of its own), and attempt 1's is not written again.
            kill = WorkerKill("after_intent", kind="model")
            app = f"{AGENT_APPS}:streaming_slow_recorded"
            async with WorkerProcess(manual_owner.db, app, kill=kill, name="second", cwd=ROOT) as second:
                await client.advance_clock(1000)  # the agent's Retry: first_delay_ms=1000
                await second.killed()
            await run_in(client, run_id, "retry_wait")
            kinds = [entry.kind for entry in await client.entries(conversation_id)]
            assert kinds == ["tether.user", "tether.aborted_answer"]

            async with serving(manual_owner.db, build_streaming(delay_s=0.01, recorded=True), name="third"):
                await client.advance_clock(10_000)
                run = await client.wait_for_run(run_id)
            assert run.status == "completed" and run.answer is not None and run.answer.text == STREAMED_ANSWER

            user, aborted, answer = await client.entries(conversation_id)
            assert (user.kind, aborted.kind, answer.kind) == (
                "tether.user",
                "tether.aborted_answer",
                "tether.assistant",
            )
            assert aborted.data == {
                "run_id": run_id,
                "turn": 1,
                "operation_id": cut.operation_id,
                "attempt": 1,
                "ended": "interrupted",
                "text": cut.text,
            }
            assert aborted.entry_id == aborted_answer_entry_id(cut.operation_id, 1)
            [op] = await client.operations(run_id)
            assert (op.status, op.attempt) == ("completed", 3)
            assert aborted.seq < answer.seq
            assert isinstance(answer.data, dict) and answer.data["text"] == STREAMED_ANSWER

            # The model was sent the user's message only, by the attempts that made a request: never the aborted text.
            first, last = read_requests(ledger)
            assert (first["attempt"], last["attempt"]) == (1, 3)
            assert first["messages"] == last["messages"] == [{"role": "user", "text": "Where is my order?"}]


async def test_an_interrupted_last_attempts_text_is_kept_by_the_commit_that_ends_the_run(
    manual_owner: OwnerProcess, ledger: Path
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(manual_owner.db) as client:
            conversation_id, run_id = await start_run(client)
            await kill_mid_stream(client, manual_owner.db, run_id, "streaming_slow_once", ledger)
            run = await run_in(client, run_id, "failed")  # no attempt left: the owner ends the run
            [op] = await client.operations(run_id)
            assert (op.status, op.attempt) == ("interrupted", 1)
            user, aborted = await client.entries(conversation_id)
            assert (user.kind, aborted.kind) == ("tether.user", "tether.aborted_answer")
            assert isinstance(aborted.data, dict) and aborted.data["ended"] == "interrupted"
            assert len(aborted.data["text"]) >= 8 and STREAMED_ANSWER.startswith(aborted.data["text"])
            assert aborted.entry_id == aborted_answer_entry_id(op.operation_id, 1)
            assert aborted.seq == run.seq  # in the commit that ended the run, before its pieces were dropped
            [dropped] = (await client.partials(run_id=run_id)).partials
            assert (dropped.status, dropped.text) == ("aborted", "")
