"""Partial output on the worker's and the reader's side (actors/_worker/_partials.py, actors/_client/_partials.py):
how the sender paces pieces and never waits on one (driven on trio's MockClock, with an owner connection that
answers when the test says), and how ``actors.PartialText`` assembles records into one text per operation."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.lowlevel
import trio.testing

import actors
from actors._client._partials import MAX_OUTPUTS
from actors._worker._partials import FINAL_PIECE_BYTES, PartialSender, partial_output
from protocol import (
    MAX_PARTIAL_BYTES,
    AppendPartial,
    Commit,
    Committed,
    ErrorCode,
    LeaseRef,
    UsageError,
    error_for_code,
)
from tests.unit._records import operation_record
from tests.unit._records import partial_record as record

LEASE = LeaseRef(task_id="t", epoch=3)


class Owner:
    """Stands in for the owner's connection: records each commit; answers once the test releases it."""

    def __init__(self) -> None:
        self.commits: list[Commit] = []
        self.release = trio.Event()
        self.refuse = False

    async def call(self, request: Commit, expected: type[Any]) -> Committed:
        self.commits.append(request)
        await self.release.wait()
        if self.refuse:
            raise error_for_code(ErrorCode.STALE_LEASE, "the lease ended")
        return Committed(seq=len(self.commits), committed_at_ms=0, results=(0,))

    def pieces(self) -> list[tuple[int, str]]:
        writes = [write for commit in self.commits for write in commit.writes]
        assert all(isinstance(write, AppendPartial) for write in writes)
        assert all(commit.lease == LEASE for commit in self.commits)
        return [(write.offset, write.text) for write in writes if isinstance(write, AppendPartial)]


@attrs.define
class Phase:
    client: Any
    lease: LeaseRef = LEASE


def phase(owner: Owner) -> Any:
    return Phase(client=actors.Client(owner))  # type: ignore[arg-type]


async def test_first_piece_at_once_then_at_most_every_interval_carrying_all_that_came(
    autojump_clock: trio.testing.MockClock,
) -> None:
    owner = Owner()
    owner.release.set()
    async with partial_output(phase(owner), "op", 2, 100) as sender:
        start = trio.current_time()
        sender.feed("Hel")
        await trio.sleep(0.001)
        assert owner.pieces() == [(0, "Hel")]  # at once
        for chunk in ("lo", ", ", "wor"):
            sender.feed(chunk)
            await trio.sleep(0.03)
        assert owner.pieces() == [(0, "Hel")]  # nothing more before 100 ms
        await trio.sleep(0.2)
        assert owner.pieces() == [(0, "Hel"), (3, "lo, wor")]  # everything since, in one piece
        assert trio.current_time() - start >= 0.1
        sender.feed("ld")
    assert sender.final_writes() == [AppendPartial(operation_id="op", attempt=2, offset=10, text="ld")]


async def test_a_piece_in_flight_never_holds_the_stream_and_the_last_piece_overlaps_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    owner = Owner()  # never answers: the piece stays in flight
    async with partial_output(phase(owner), "op", 1, 100) as sender:
        sender.feed("abc")
        await trio.sleep(1)
        for chunk in "defgh":
            sender.feed(chunk)  # returns at once though a piece waits for its reply
        await trio.sleep(1)
        assert owner.pieces() == [(0, "abc")]
    # The piece in flight was cut short, its outcome unknown: the last piece starts where the owner surely is.
    assert sender.final_writes() == [AppendPartial(operation_id="op", attempt=1, offset=0, text="abcdefgh")]


async def test_a_refused_piece_stops_the_pieces_of_the_attempt(autojump_clock: trio.testing.MockClock) -> None:
    owner = Owner()
    owner.refuse = True
    owner.release.set()
    async with partial_output(phase(owner), "op", 1, 50) as sender:
        sender.feed("abc")
        await trio.sleep(1)
        sender.feed("def")
        await trio.sleep(1)
    assert owner.pieces() == [(0, "abc")] and sender.stopped is not None
    assert sender.final_writes() == []
    sender.feed("more" * 1000)  # the stream goes on after the pieces stopped: nothing more is held for them
    assert sender._unsent == [] and sender._in_flight == ""


async def test_interval_0_sends_only_at_the_end_and_the_last_piece_is_bounded() -> None:
    owner = Owner()
    async with partial_output(phase(owner), "op", 1, 0) as sender:
        sender.feed("é" * FINAL_PIECE_BYTES)
        await trio.lowlevel.checkpoint()
    assert owner.commits == []
    [last] = sender.final_writes()
    assert last.offset == 0 and len(last.text.encode()) <= FINAL_PIECE_BYTES and last.text == "é" * len(last.text)


def test_a_sender_holds_nothing_it_did_not_get() -> None:
    sender = PartialSender(phase(Owner()), "op", 1, 100)
    assert sender.final_writes() == []
    sender.feed("")
    assert sender.final_writes() == []


def test_partial_interval_ms_is_checked() -> None:
    app = actors.App("a")
    model = actors.ScriptedModel([actors.ScriptedTurn(text="x")])
    for bad in (-1, 1.5, 60_001, "100"):
        with pytest.raises(UsageError, match="partial_interval_ms"):
            app.define_agent("support", version=1, model=model, partial_interval_ms=bad)  # type: ignore[arg-type]
    assert app.agents == {}
    assert app.define_agent("support", version=1, model=model).partial_interval_ms == 100


# ------------------------------------------------------------------------------------------------ PartialText


def test_partial_text_skips_what_it_holds_and_replaces_a_retried_attempt() -> None:
    reader = actors.PartialText()
    reader.feed(record(0, "Hel", seq=1))
    reader.feed([record(0, "Hello", seq=2), "not a record"])  # an overlap: only "lo" is new
    assert reader.text("op") == "Hello"
    assert reader.feed(record(3, "lo", seq=3)) == []  # all held already: nothing changed
    reader.feed(record(5, "", status="aborted", seq=4))
    assert reader.outputs["op"].status == "aborted" and reader.streaming == []
    [output] = reader.feed(record(0, "Bye", attempt=2, seq=5))  # the next attempt replaces the text
    assert (output.attempt, output.text, output.status) == (2, "Bye", "streaming")
    assert reader.feed(record(3, "zzz", attempt=1, seq=4)) == []  # older than what is held: ignored
    reader.feed(record(3, "", attempt=2, status="done", seq=6))
    assert (reader.text("op"), reader.outputs["op"].status) == ("Bye", "done")


def test_partial_text_after_a_retried_run_restarts_the_attempt_numbers() -> None:
    reader = actors.PartialText()
    reader.feed([record(0, "first", seq=1), record(5, "", status="aborted", seq=2)])
    reader.feed(record(0, "again", seq=9))  # attempt 1 again (retry_run starts over): a new text, not "first"
    assert reader.text("op") == "again" and reader.outputs["op"].status == "streaming"
    reader.feed(record(5, "", status="aborted", seq=10))
    reader.feed(record(0, "", status="done", seq=12))  # a later attempt 1 that streamed no text (tool calls only)
    assert reader.text("op") == "" and reader.outputs["op"].status == "done"


def test_partial_text_started_mid_stream_or_past_a_gap_holds_from_there() -> None:
    reader = actors.PartialText()
    reader.feed(record(10, "abc", seq=1))
    assert (reader.outputs["op"].start, reader.text("op")) == (10, "abc")
    reader.feed(record(20, "xyz", seq=2))  # a gap: what is held cannot be continued
    assert (reader.outputs["op"].start, reader.text("op")) == (20, "xyz")
    reader.feed(record(23, "", status="done", seq=3, op="other"))
    assert reader.text("other") == "" and list(reader.outputs) == ["op", "other"]


def test_partial_text_says_what_each_record_added() -> None:
    reader = actors.PartialText()
    [first] = reader.feed(record(0, "Hel", seq=1))
    [second] = reader.feed(record(1, "ello", seq=2))  # an overlap: "lo" is new
    [ended] = reader.feed(record(5, "", status="aborted", seq=3))
    [again] = reader.feed(record(0, "Bye", attempt=2, seq=4))
    assert [o.added for o in (first, second, ended, again)] == ["Hel", "lo", "", "Bye"]
    assert reader.replaces(record(0, "x", attempt=3, seq=5)) and not reader.replaces(record(3, "!", attempt=2, seq=5))


def test_partial_text_settles_from_the_operation_record_ordered_by_seq() -> None:
    reader = actors.PartialText()
    reader.feed(record(0, "abc", seq=5))
    assert reader.settle(operation_record("failed", seq=4)) is None  # older than the text held
    assert reader.settle(operation_record("started", seq=6)) is None
    cut = reader.settle(operation_record("failed", seq=6))  # a tool call's record settles its progress the same way
    assert cut is not None and (cut.status, cut.text, cut.seq) == ("aborted", "abc", 6)
    assert reader.feed(record(3, "", status="aborted", seq=6)) == []  # the record of the same commit
    assert reader.settle(operation_record("interrupted", seq=7)) is None  # cut off already
    reader.feed(record(0, "xyz", attempt=2, seq=8))
    done = reader.settle(operation_record("completed", attempt=2, seq=9))
    assert done is not None and (done.status, done.text) == ("done", "xyz")
    assert reader.forget("op") == done and reader.outputs == {} and reader.forget("op") is None


def test_partial_text_keeps_the_tail_of_a_text_and_its_most_recently_changed_outputs() -> None:
    reader = actors.PartialText(max_outputs=2, max_chars=4)
    reader.feed(record(0, "abcdef", seq=1))
    assert (reader.outputs["op"].start, reader.text("op")) == (2, "cdef")
    [output] = reader.feed(record(4, "efgh", seq=2))  # offsets stay right after the head was dropped
    assert (output.start, output.text, output.added) == (4, "efgh", "gh")
    reader.feed(record(0, "1", seq=3, op="b"))
    reader.feed(record(8, "i", seq=4))  # "op" changed after "b"
    reader.feed(record(0, "2", seq=5, op="c"))
    assert list(reader.outputs) == ["op", "c"]  # "b" was the least recently changed
    with pytest.raises(TypeError):
        reader.outputs["x"] = output  # type: ignore[index]


def test_partial_text_holds_a_whole_attempt_by_default_and_its_bounds_are_checked() -> None:
    reader = actors.PartialText()
    whole = "x" * MAX_PARTIAL_BYTES  # the most the owner stores of an attempt
    reader.feed(record(0, whole, seq=1))
    assert reader.outputs["op"].start == 0 and reader.text("op") == whole
    for index in range(MAX_OUTPUTS + 5):
        reader.feed(record(0, "y", seq=index + 2, op=f"op-{index}"))
    assert len(reader.outputs) == MAX_OUTPUTS and "op" not in reader.outputs
    for bad in ({"max_outputs": 0}, {"max_chars": -1}, {"max_chars": 1.5}, {"max_outputs": True}):
        with pytest.raises(UsageError, match=next(iter(bad))):
            actors.PartialText(**bad)  # type: ignore[arg-type]
