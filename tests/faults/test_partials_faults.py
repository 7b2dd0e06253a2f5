"""Partial output when a worker is SIGKILLed mid-stream: the owner marks the cut attempt's output aborted (never an
answer), the retry's output replaces it from offset 0, and the answer is the retry's; a watch replaying the log sees
exactly that, once (docs/runs.md, "Partial output")."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import trio

import actors
from protocol import PartialRecord
from tests.conftest import OwnerProcess
from tests.integration import _agent_apps
from tests.integration._agent_apps import STREAMED_ANSWER
from tests.integration._agent_helpers import kill_mid_stream, ledger, run_in, serving, start_run

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 60


async def test_worker_killed_mid_stream_aborts_its_partial_and_the_retry_replaces_it(
    manual_owner: OwnerProcess, ledger: Path
) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with actors.connect(manual_owner.db) as client:
            conversation_id, run_id = await start_run(client)
            await kill_mid_stream(client, manual_owner.db, run_id, "streaming_slow", ledger)
            await run_in(client, run_id, "retry_wait")
            [cut] = (await client.partials(run_id=run_id)).partials
            assert (cut.attempt, cut.status, cut.offset) == (1, "aborted", 0)
            assert len(cut.text) >= 8 and STREAMED_ANSWER.startswith(cut.text)

            async with serving(manual_owner.db, _agent_apps.streaming, name="second"):
                await client.advance_clock(1000)  # the agent's Retry: first_delay_ms=1000
                run = await client.wait_for_run(run_id)
            assert run.status == "completed" and run.answer is not None and run.answer.text == STREAMED_ANSWER
            [op] = await client.operations(run_id)
            assert (op.status, op.attempt) == ("completed", 2)

            # The log, replayed by a watch from the start: attempt 1's pieces, aborted, attempt 2's from 0, done.
            partials: list[PartialRecord] = []
            reader = actors.PartialText()
            async with client.watch(conversation_id=conversation_id, from_seq=0) as changes:
                async for change in changes:
                    partials += [r for r in change.records if isinstance(r, PartialRecord)]
                    for output in reader.feed(change.records):
                        assert STREAMED_ANSWER.startswith(output.text), output  # never text twice
                    if change.seq >= run.answer.seq:
                        break
            shape = [(p.attempt, p.status) for p in partials]
            aborted_at = shape.index((1, "aborted"))
            assert set(shape[:aborted_at]) == {(1, "streaming")}
            assert set(shape[aborted_at + 1 : -1]) == {(2, "streaming")} and shape[-1] == (2, "done")
            first = "".join(p.text for p in partials[:aborted_at])
            assert first == cut.text and partials[aborted_at].offset == len(cut.text)
            assert partials[aborted_at + 1].offset == 0
            assert "".join(p.text for p in partials[aborted_at + 1 : -1]) == STREAMED_ANSWER
            assert reader.text(op.operation_id) == STREAMED_ANSWER
            assert reader.outputs[op.operation_id].attempt == 2

            [stored] = (await client.partials(run_id=run_id)).partials
            assert (stored.attempt, stored.status, stored.offset, stored.text) == (2, "done", len(STREAMED_ANSWER), "")
