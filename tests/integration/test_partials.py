"""Partial output against a real owner: a worker streams a slow scripted model, a watch of the conversation sees
the pieces in order before the answer, a retried attempt replaces the first one's text (never twice), a watch
resumed from a seq continues exactly, and ``client.partials`` reads what is stored (docs/runs.md, "Partial
output")."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import trio

import actors
from protocol import EntryRecord, PartialRecord, RunRecord
from tests.conftest import OwnerProcess
from tests.integration import _agent_apps
from tests.integration._agent_apps import STREAMED_ANSWER
from tests.integration._agent_helpers import ledger, serving, start_run

__all__ = ["ledger"]  # the fixture

TIMEOUT_S: Final = 60
CUT_AT: Final = 40


async def follow(
    client: actors.Client, conversation_id: str, from_seq: int, *, advance_on_retry: bool
) -> tuple[list[PartialRecord], list[actors.Change], int]:
    """Watch the conversation from ``from_seq`` until its run completes: its partial records, every change, and the
    seq of the assistant entry (the answer). Advances the manual clock past the retry delay when asked."""
    partials: list[PartialRecord] = []
    changes: list[actors.Change] = []
    answer_seq = -1
    async with client.watch(conversation_id=conversation_id, from_seq=from_seq) as stream:
        async for change in stream:
            changes.append(change)
            for record in change.records:
                if isinstance(record, PartialRecord):
                    partials.append(record)
                elif isinstance(record, EntryRecord) and record.kind == "tether.assistant":
                    answer_seq = change.seq
                elif isinstance(record, RunRecord) and record.status == "retry_wait" and advance_on_retry:
                    await client.advance_clock(1000)  # the agent's Retry: first_delay_ms=1000
            if any(isinstance(r, RunRecord) and r.status == "completed" for r in change.records):
                return partials, changes, answer_seq
    raise AssertionError("the watch ended before the run completed")


def contiguous(pieces: list[PartialRecord]) -> str:
    text = ""
    for piece in pieces:
        assert piece.offset == len(text), (piece.offset, len(text))
        text += piece.text
    return text


async def test_a_watch_sees_pieces_before_the_answer_and_a_retry_replaces_them(
    manual_owner: OwnerProcess, ledger: Path
) -> None:
    app = _agent_apps.build_streaming(cut_after_chars=CUT_AT)
    with trio.fail_after(TIMEOUT_S):
        async with serving(manual_owner.db, app) as client:
            conversation_id, run_id = await start_run(client)
            partials, changes, answer_seq = await follow(client, conversation_id, 0, advance_on_retry=True)
            run = await client.wait_for_run(run_id)
            assert run.status == "completed" and run.answer is not None and run.answer.text == STREAMED_ANSWER

            # Attempt 1: pieces of the text up to the cut, then aborted (never an answer).
            first = [p for p in partials if p.attempt == 1 and p.status == "streaming"]
            assert contiguous(first) == STREAMED_ANSWER[:CUT_AT]
            [aborted] = [p for p in partials if p.status == "aborted"]
            assert (aborted.attempt, aborted.offset, aborted.text) == (1, CUT_AT, "")
            # Attempt 2: several pieces from offset 0, all before the answer; done in the answer's commit.
            second = [p for p in partials if p.attempt == 2 and p.status == "streaming"]
            assert contiguous(second) == STREAMED_ANSWER
            assert len(second) >= 2, "the text went out in several pieces while the model streamed"
            [done] = [p for p in partials if p.status == "done"]
            assert (done.attempt, done.offset, done.text) == (2, len(STREAMED_ANSWER), "")
            assert done.seq == answer_seq == run.answer.seq
            assert [p.seq for p in partials] == sorted(p.seq for p in partials)
            # (the rest of the text rides in the answer's commit, before its done)
            assert all(p.seq < answer_seq for p in [*first, aborted, *second[:-1]]) and second[-1].seq <= answer_seq
            assert partials.index(second[-1]) < partials.index(done)
            assert partials.index(aborted) < partials.index(second[0])
            assert {p.operation_id for p in partials} == {done.operation_id}

            # A reader assembling them never holds text twice: always a prefix of one attempt's text.
            reader = actors.PartialText()
            for change in changes:
                for output in reader.feed(change):
                    assert STREAMED_ANSWER.startswith(output.text), output
            assert reader.text(done.operation_id) == STREAMED_ANSWER
            assert reader.outputs[done.operation_id].status == "done" and not reader.streaming

            # A watch resumed from a seq in the middle continues exactly where the first one was then.
            middle = second[len(second) // 2].seq - 1
            resumed, _, _ = await follow(client, conversation_id, middle, advance_on_retry=False)
            assert resumed == [p for p in partials if p.seq > middle]

            # What is stored: the operation's output is done, its pieces compacted away (the answer is the entry).
            stored = await client.partials(run_id=run_id)
            assert [(p.attempt, p.offset, p.text, p.status) for p in stored.partials] == [
                (2, len(STREAMED_ANSWER), "", "done")
            ]
            assert (await client.partials(operation_id=done.operation_id)).partials == stored.partials


async def test_partials_read_while_streaming_then_a_watch_from_the_read_seq(owner: OwnerProcess, ledger: Path) -> None:
    with trio.fail_after(TIMEOUT_S):
        async with serving(owner.db, _agent_apps.streaming) as client:
            conversation_id, run_id = await start_run(client)
            while True:  # the text so far, as stored, while the model still streams
                read = await client.partials(run_id=run_id)
                if read.partials and read.partials[0].text:
                    break
                await trio.sleep(0.02)
            [so_far] = read.partials
            assert so_far.status == "streaming" and so_far.offset == 0
            assert STREAMED_ANSWER.startswith(so_far.text)
            rest, _, _ = await follow(client, conversation_id, read.seq, advance_on_retry=False)
            reader = actors.PartialText()
            reader.feed(so_far)
            for piece in rest:
                reader.feed(piece)
                assert STREAMED_ANSWER.startswith(reader.text(so_far.operation_id) or "")
            assert reader.text(so_far.operation_id) == STREAMED_ANSWER
            assert reader.outputs[so_far.operation_id].status == "done"
