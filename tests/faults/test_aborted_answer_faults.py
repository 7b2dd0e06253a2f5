"""An interrupted partial answer is kept: a worker SIGKILLed while its model streams, after some text went to the
owner, and a new worker finishing the run; the transcript then holds a ``tether.aborted_answer`` entry with the text
the cut-off attempt had streamed, before the answer that replaced it, and the request that made that answer was not
sent it (docs/agents.md, "Partial output"; docs/runs.md, "Partial output")."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import trio

import actors
from actors._worker._journal import _derived
from tests.conftest import OwnerProcess
from tests.integration._agent_apps import STREAMED_ANSWER, build_streaming, read_requests
from tests.integration._agent_helpers import ledger, run_in, serving, start_run, worker_process

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 60


async def test_the_text_a_killed_worker_had_streamed_is_kept_as_an_aborted_entry_the_model_is_never_sent(
    manual_owner: OwnerProcess, ledger: Path
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(manual_owner.db) as client:
            conversation_id, run_id = await start_run(client)
            async with worker_process(manual_owner.db, "streaming_slow_recorded", ledger) as process:
                while True:  # some pieces are stored: the model is mid-stream
                    read = await client.partials(run_id=run_id)
                    if read.partials and len(read.partials[0].text) >= 8:
                        break
                    await trio.sleep(0.02)
                process.kill()
                await process.wait()
            await run_in(client, run_id, "retry_wait")
            [cut] = (await client.partials(run_id=run_id)).partials
            assert (cut.attempt, cut.status) == (1, "aborted") and STREAMED_ANSWER.startswith(cut.text)
            assert [entry.kind for entry in await client.entries(conversation_id)] == ["tether.user"]

            async with serving(manual_owner.db, build_streaming(delay_s=0.01, recorded=True), name="second"):
                await client.advance_clock(1000)  # the agent's Retry: first_delay_ms=1000
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
            assert aborted.entry_id == _derived(cut.operation_id, "aborted_answer", 1)
            # Committed with attempt 2's intent: before any of its text streamed, and before the answer.
            [op] = await client.operations(run_id)
            assert (op.status, op.attempt) == ("completed", 2)
            assert aborted.seq < answer.seq
            assert isinstance(answer.data, dict) and answer.data["text"] == STREAMED_ANSWER

            # The model was sent the user's message only, by both attempts: never the aborted text.
            first, second = read_requests(ledger)
            assert (first["attempt"], second["attempt"]) == (1, 2)
            assert first["messages"] == second["messages"] == [{"role": "user", "text": "Where is my order?"}]
