"""``tether watch``'s pure parts: the assembly of streamed text from partial records, the view folded from records,
and its rendering (on a rich console of a fixed size, read back as text)."""

from __future__ import annotations

import io
from typing import Any

import attrs
from rich.console import Console

import actors
from actors import tool_operation_id
from protocol import (
    EntryRecord,
    InteractionAnswer,
    InteractionRecord,
    JsonValue,
    PartialRecord,
    Retry,
    RunRecord,
    RunUsage,
    SubmissionRecord,
    TaskOutcome,
    TaskRecord,
)
from runtime._watch import json_line
from runtime._watch_render import _task_label, render
from runtime._watch_view import MAX_ENTRIES_PER_CONVERSATION, MAX_PARTIAL_CHARS, MAX_STREAMS, WatchView
from tests.unit._records import operation_record, partial_record

CONVERSATION = "c0000000-0000-7000-8000-000000000001"
RUN = "r0000000-0000-7000-8000-000000000001"
TASK = "t0000000-0000-7000-8000-000000000001"
MODEL_OP = "m0000000-0000-7000-8000-000000000001"


def piece(
    offset: int, text: str, *, attempt: int = 1, status: str = "streaming", seq: int = 10, op: str = MODEL_OP
) -> Any:
    return partial_record(
        offset, text, seq=seq, attempt=attempt, status=status, op=op, run_id=RUN, conversation_id=CONVERSATION
    )


def operation(
    status: str, *, kind: str = "model", attempt: int = 1, op: str = MODEL_OP, name: str = "scripted", seq: int = 1
) -> Any:
    return operation_record(
        status,
        seq=seq,
        attempt=attempt,
        kind=kind,
        name=name,
        op=op,
        run_id=RUN,
        conversation_id=CONVERSATION,
        task_id=TASK,
    )


def run(
    status: str,
    *,
    reason: str | None = None,
    operation_id: str | None = None,
    seq: int = 1,
    error: str | None = None,
    cost: float | None = None,
) -> RunRecord:
    return RunRecord(
        run_id=RUN,
        conversation_id=CONVERSATION,
        agent="support",
        version=1,
        status=status,  # type: ignore[arg-type]
        reason=reason,
        error=error,
        operation_id=operation_id,
        usage=RunUsage(input_tokens=12, output_tokens=3, cost=cost),
        submission_id=RUN,
        task_id=TASK,
        seq=seq,
        created_at_ms=0,
        updated_at_ms=0,
    )


def entry(position: int, kind: str, data: dict[str, Any], *, conversation_id: str = CONVERSATION) -> EntryRecord:
    return EntryRecord(
        entry_id=f"e{position}",
        conversation_id=conversation_id,
        position=position,
        seq=position + 1,
        kind=kind,
        data=JsonValue(data),
        created_at_ms=0,
    )


def task(task_id: str, kind: str, status: str, *, owner: str | None = None, on: tuple[str, ...] = ()) -> TaskRecord:
    outcome = TaskOutcome(status="completed") if status == "terminal" else None
    return TaskRecord(
        task_id=task_id,
        kind=kind,
        version=1,
        conversation_id=CONVERSATION,
        owner_task_id=owner,
        background=False,
        abandon_on_restart=False,
        status=status,  # type: ignore[arg-type]
        phase=None,
        on=on,
        outcome=outcome,
        seq=1,
        created_at_ms=0,
        updated_at_ms=0,
    )


def interaction(status: str, *, approve: bool | None = None, tool: str = "lookup") -> InteractionRecord:
    tool_op = tool_operation_id(RUN, 1, "call-1")
    answer = None if approve is None else InteractionAnswer(approve=approve, note=None, responded_by=None, at_ms=0)
    return InteractionRecord(
        interaction_id="i0000000-0000-7000-8000-000000000001",
        run_id=RUN,
        conversation_id=CONVERSATION,
        operation_id=tool_op,
        tool=tool,
        task_id="a0000000-0000-7000-8000-000000000001",
        kind="approval",
        status=status,  # type: ignore[arg-type]
        args=JsonValue({"order_id": "A1"}),
        digest="d",
        answer=answer,
        seq=7,
        created_at_ms=0,
        updated_at_ms=0,
    )


def question(status: str, *, value: Any = None, schema: Any = None) -> InteractionRecord:
    """The question ``lookup`` asks (``call.ask``), answered with ``value`` when given."""
    answer = (
        None
        if value is None
        else InteractionAnswer(approve=None, note=None, responded_by=None, at_ms=0, value=JsonValue(value))
    )
    return attrs.evolve(
        interaction(status),
        kind="question",
        args=JsonValue({"text": "Refund A1 in full?", "schema": schema}),
        answer=answer,
    )


def screen(view: WatchView, *, width: int = 120, height: int = 40) -> str:
    console = Console(file=io.StringIO(), width=width, height=height, record=True, color_system=None)
    console.print(render(view, console))
    return console.export_text()


# ------------------------------------------------------------------------------------------- PartialText


def watch_text(**bounds: int) -> actors.PartialText:
    """The assembler as the view holds it (its bounds unless given)."""
    return actors.PartialText(**{"max_outputs": MAX_STREAMS, "max_chars": MAX_PARTIAL_CHARS, **bounds})


def added(text: actors.PartialText, record: PartialRecord) -> str:
    """The characters ``record`` added to what is shown (``""``: none)."""
    return "".join(output.added for output in text.feed(record))


def test_pieces_are_assembled_in_order_and_report_what_they_added() -> None:
    text = watch_text()
    assert added(text, piece(0, "Your or", seq=1)) == "Your or"
    assert added(text, piece(7, "der ", seq=2)) == "der "
    assert added(text, piece(11, "shipped.", seq=3)) == "shipped."
    stream = text.outputs.get(MODEL_OP)
    assert stream is not None and stream.text == "Your order shipped." and stream.status == "streaming"


def test_a_piece_already_held_is_skipped_and_an_overlap_adds_only_its_new_characters() -> None:
    text = watch_text()
    text.feed(piece(0, "Hello, wor"))
    assert added(text, piece(0, "Hello")) == ""  # a repeat (e.g. a resubscription from an earlier seq)
    assert added(text, piece(7, "world!")) == "ld!"
    stream = text.outputs.get(MODEL_OP)
    assert stream is not None and stream.text == "Hello, world!"


def test_a_later_attempt_replaces_the_earlier_ones_text_and_late_pieces_of_the_old_one_are_ignored() -> None:
    text = watch_text()
    text.feed(piece(0, "First try, cut", seq=1))
    assert text.replaces(piece(0, "Second", attempt=2, seq=2))
    assert added(text, piece(0, "Second", attempt=2, seq=2)) == "Second"
    assert added(text, piece(14, " and more", attempt=1, seq=1)) == ""  # committed before attempt 2's piece
    stream = text.outputs.get(MODEL_OP)
    assert stream is not None and (stream.attempt, stream.text) == (2, "Second")


def test_a_later_attempt_with_a_smaller_number_replaces_the_text() -> None:
    # retry_run starts the attempt numbers over: what comes later (by seq) is the later attempt.
    text = watch_text()
    text.feed([piece(0, "Second try", attempt=2, seq=6), piece(10, "", attempt=2, status="aborted", seq=7)])
    assert added(text, piece(0, "Again", attempt=1, seq=10)) == "Again"
    stream = text.outputs.get(MODEL_OP)
    assert stream is not None and (stream.attempt, stream.text, stream.status) == (1, "Again", "streaming")


def test_an_aborted_piece_marks_the_text_cut_off_and_a_retry_replaces_it() -> None:
    text = watch_text()
    text.feed(piece(0, "Half an ans", seq=1))
    text.feed(piece(11, "wer", status="aborted", seq=2))
    stream = text.outputs.get(MODEL_OP)
    assert stream is not None and stream.status == "aborted" and stream.text == "Half an answer"
    text.feed(piece(0, "A whole answer.", attempt=2, seq=3))
    stream = text.outputs.get(MODEL_OP)
    assert stream is not None and stream.status == "streaming" and stream.text == "A whole answer."


def test_done_or_the_committed_result_forgets_the_text_and_a_failed_attempt_cuts_it_off() -> None:
    # As the view folds them: a text marked done (by its record or by the operation's result) is forgotten.
    view = WatchView("tether.db", conversation_id=CONVERSATION)
    view.apply(1, [piece(0, "abc", seq=1)])
    assert view.apply(2, [piece(3, "", status="done", seq=2)]) == []
    assert view.partials.outputs.get(MODEL_OP) is None
    view.apply(3, [piece(0, "abc", attempt=2, seq=3)])
    assert view.apply(2, [operation("failed", attempt=2, seq=2)]) == []  # older than the text held: ignored
    lines = view.apply(4, [operation("failed", attempt=2, seq=4)])
    assert lines == ["(cut off: attempt 2 failed; this is not an answer)"]
    stream = view.partials.outputs.get(MODEL_OP)
    assert stream is not None and stream.status == "aborted"
    view.apply(5, [piece(0, "xyz", attempt=3, seq=5)])
    assert view.apply(6, [operation("completed", attempt=3, seq=6)]) == []
    assert view.partials.outputs.get(MODEL_OP) is None


def test_a_watch_that_starts_mid_stream_keeps_the_offset_of_what_it_holds() -> None:
    text = watch_text()
    assert added(text, piece(40, "tail")) == "tail"
    stream = text.outputs.get(MODEL_OP)
    assert stream is not None and (stream.start, stream.end) == (40, 44)
    view = WatchView("tether.db", conversation_id=CONVERSATION)
    view.apply(10, [piece(40, "tail")])
    assert "assistant (streaming, attempt 1): …tail" in screen(view)  # the head it missed is marked


def test_the_text_held_and_the_streams_held_are_bounded() -> None:
    text = watch_text(max_chars=10)
    for offset in range(0, 100, 5):
        text.feed(piece(offset, "abcde"))
    stream = text.outputs.get(MODEL_OP)
    assert stream is not None and stream.text == "abcdeabcde" and (stream.start, stream.end) == (90, 100)
    assert added(text, piece(95, "abcdeXY")) == "XY"  # offsets stay right after the head was dropped
    view = WatchView("tether.db")
    for index in range(MAX_STREAMS + 10):
        view.apply(index + 1, [piece(0, "x", op=f"op-{index}", seq=index + 1)])
    assert len(view.streams()) == MAX_STREAMS
    assert view.partials.outputs.get("op-0") is None and view.partials.outputs.get(f"op-{MAX_STREAMS + 9}")
    long = "y" * (MAX_PARTIAL_CHARS + 5)
    view.apply(MAX_STREAMS + 20, [piece(0, long, op="long", seq=MAX_STREAMS + 20)])
    held = view.partials.outputs.get("long")
    assert held is not None and (held.start, len(held.text)) == (5, MAX_PARTIAL_CHARS)


# ---------------------------------------------------------------------------------------------- the view


def approval_story() -> WatchView:
    view = WatchView("tether.db", conversation_id=CONVERSATION)
    view.apply(2, [run("queued", seq=2)])
    view.apply(
        3,
        [
            entry(0, "tether.user", {"text": "where is A1", "run_id": RUN}),
            task(TASK, "agent:support", "running"),
            run("running", seq=3),
        ],
    )
    view.apply(4, [piece(0, "Let me look", seq=4)])
    assistant = {
        "run_id": RUN,
        "turn": 1,
        "text": "",
        "tool_calls": [{"call_id": "call-1", "name": "lookup", "arguments": {"order_id": "A1"}}],
    }
    view.apply(
        5,
        [
            operation("completed", seq=5),
            entry(1, "tether.assistant", assistant),
            task("tool-1", "tool:lookup", "pending", owner=TASK),
        ],
    )
    view.apply(
        7,
        [
            interaction("open"),
            task("tool-1", "tool:lookup", "waiting", owner=TASK, on=("a0000000-0000-7000-8000-000000000001",)),
        ],
    )
    view.apply(8, [run("waiting", operation_id=tool_operation_id(RUN, 1, "call-1"), seq=8)])
    return view


def test_the_view_shows_an_open_approval_with_the_commands_that_answer_it() -> None:
    view = approval_story()
    [waiting] = view.attention()
    assert waiting.commands == (
        "tether respond --db tether.db i0000000-0000-7000-8000-000000000001 --approve",
        "tether respond --db tether.db i0000000-0000-7000-8000-000000000001 --deny",
    )
    [assistant] = [e for e in view.entries(CONVERSATION) if e.kind == "tether.assistant"]
    [call] = view.tool_calls(assistant)
    assert (call.name, call.arguments, call.status) == ("lookup", {"order_id": "A1"}, "waiting for approval")
    assert view.partials.outputs.get(MODEL_OP) is None  # the committed result replaced the streamed text
    text = screen(view)
    assert "waiting for you" in text and "approval i0000000-0000-7000-8000-000000000001: lookup" in text
    assert "tether respond --db tether.db i0000000-0000-7000-8000-000000000001 --approve" in text
    assert "you: where is A1" in text and 'tool lookup {"order_id":"A1"}  waiting for approval' in text
    assert "tether.approval" in text and "tool:lookup" in text and "agent:support" in text


def test_the_answer_the_result_and_the_settled_run_replace_what_waited() -> None:
    view = approval_story()
    view.apply(9, [interaction("answered", approve=True)])
    result = {
        "run_id": RUN,
        "operation_id": "x",
        "call_id": "call-1",
        "name": "lookup",
        "content": '{"status": "shipped"}',
        "is_error": False,
    }
    view.apply(12, [entry(2, "tether.tool_result", result)])
    view.apply(14, [piece(0, "Your order ", seq=14, op="m2")])
    streaming = screen(view)
    assert "assistant (streaming, attempt 1): Your order" in streaming
    view.apply(
        15,
        [
            operation("completed", op="m2", seq=15),
            entry(3, "tether.assistant", {"run_id": RUN, "turn": 2, "text": "Your order shipped.", "tool_calls": []}),
            run("completed", seq=15),
        ],
    )
    assert view.attention() == []
    text = screen(view)
    assert "waiting for you" not in text and "streaming" not in text
    assert "done" in text and '{"status": "shipped"}' in text and "assistant: Your order shipped." in text


def test_a_denied_call_never_shows_as_running() -> None:
    # The call that ran nothing is journaled, intent and failure, in the commit of its result: its intent is not a
    # state anyone saw, and the call is shown as what it became.
    view = approval_story()
    assert view.apply(9, [interaction("answered", approve=False)]) == [
        "approval i0000000-0000-7000-8000-000000000001 denied"
    ]
    tool_op = tool_operation_id(RUN, 1, "call-1")
    denial = "error: the call was denied by a person"
    result = {"run_id": RUN, "operation_id": tool_op, "call_id": "call-1", "name": "lookup", "content": denial}
    lines = view.apply(
        10,
        [
            operation("started", kind="tool", op=tool_op, name="lookup", seq=10),
            operation("failed", kind="tool", op=tool_op, name="lookup", seq=10),
            entry(2, "tether.tool_result", {**result, "is_error": True}),
        ],
    )
    assert lines == [f"tool lookup result (error): {denial}"]
    [assistant] = [e for e in view.entries(CONVERSATION) if e.kind == "tether.assistant"]
    [call] = view.tool_calls(assistant)
    assert (call.status, call.result) == ("error", denial)
    assert "running" not in screen(view).split("transcript")[-1]


def test_an_interaction_names_its_tool_without_the_call_in_view() -> None:
    view = WatchView("tether.db")  # a watch from a later seq: neither the assistant entry nor the operation is held
    lines = view.apply(7, [interaction("open", tool="refund")])
    assert lines[0] == 'approval i0000000-0000-7000-8000-000000000001 waits: refund {"order_id":"A1"}'
    assert view.attention()[0].what == 'approval i0000000-0000-7000-8000-000000000001: refund {"order_id":"A1"}'


def test_a_cut_off_stream_is_shown_as_such_never_as_an_answer() -> None:
    view = WatchView("tether.db", conversation_id=CONVERSATION)
    view.apply(3, [run("running", seq=3)])
    lines = view.apply(4, [piece(0, "Half an answ", status="aborted", seq=4)])
    assert lines[-1] == "(cut off: attempt 1 stopped here; this is not an answer)"
    text = screen(view)
    assert "assistant (attempt 1, cut off): Half an answ" in text and "cut off here: not an answer" in text
    assert "assistant: Half" not in text


def test_needs_attention_and_failed_runs_give_the_command_that_settles_them() -> None:
    view = WatchView("db.sqlite")
    view.apply(5, [run("needs_attention", reason="tool_interrupted", operation_id="op-9")])
    [item] = view.attention()
    assert item.commands[0].startswith("tether resolve --db db.sqlite op-9 --output JSON")
    view.apply(6, [run("failed", reason="model_error", seq=6)])
    [item] = view.attention()
    assert item.commands == (f"tether retry --db db.sqlite {RUN}",)
    assert f"tether retry --db db.sqlite {RUN}" in screen(view)


CONNECT_ERROR = (
    "model request failed (attempt 4 of 4): connection: could not reach model 'm' at "
    "http://127.0.0.1:9/v1/chat/completions: ConnectError: all attempts to connect to 127.0.0.1:9 failed"
)


def test_a_failed_run_says_why_in_every_view() -> None:
    view = WatchView("db.sqlite", conversation_id=CONVERSATION)
    view.apply(5, [run("retry_wait", seq=5)])
    lines = view.apply(6, [run("failed", reason="model_error", error=CONNECT_ERROR, seq=6)])
    assert lines[0] == f"run {RUN}: failed (model_error): {CONNECT_ERROR}"
    [item] = view.attention()
    assert item.what == f"run {RUN} failed (model_error): {CONNECT_ERROR}"
    text = screen(view, width=200)  # in the panel of what waits for a person, wrapped at its width
    assert "failed (model_error): model request failed (attempt 4 of 4): connection: could not reach" in text
    assert "all attempts to connect to 127.0.0.1:9 failed" in text
    assert '"error": "model request failed (attempt 4 of 4)' in json_line(view.runs.get(RUN), 6)


def test_a_run_waiting_to_retry_says_which_attempt_failed_why_and_when_the_next_is() -> None:
    view = WatchView("db.sqlite", conversation_id=CONVERSATION)
    view.apply(3, [run("running", seq=3), task(TASK, "agent:support", "running")])
    failed = attrs.evolve(operation("failed", seq=5), error="connection: could not reach", retry=Retry(attempts=4))
    sleeping = attrs.evolve(task(TASK, "agent:support", "sleeping"), until_ms=1_500, updated_at_ms=1_000)
    view.apply(5, [failed, sleeping])
    lines = view.apply(6, [run("retry_wait", seq=6)])
    assert lines == [f"run {RUN}: retry_wait: attempt 1 of 4 failed (connection: could not reach); the next in 500 ms"]
    assert view.retry_note(run("running")) is None


def test_a_run_whose_agent_no_worker_announces_says_what_starts_one() -> None:
    view = WatchView("db.sqlite")
    lines = view.apply(5, [run("pending", reason="agent_missing", seq=5)])
    commands = [
        "start a worker whose app defines agent support: tether worker --db db.sqlite --app MODULE:ATTR",
        f"tether cancel --db db.sqlite {RUN}",
    ]
    assert lines == [f"run {RUN}: pending (agent_missing)", *(f"  {command}" for command in commands)]
    queued = attrs.evolve(run("queued", seq=6), run_id="r0000000-0000-7000-8000-000000000002", task_id=None)
    view.apply(6, [queued])  # a follow-up behind it: it is still what waits
    [item] = view.attention()
    assert (item.what, item.commands) == (f"run {RUN} pending (agent_missing)", tuple(commands))
    view.apply(6, [run("running", seq=6)])  # a worker with the agent attached: nothing waits for a person
    assert view.attention() == []


def test_costs_are_plain_decimals_and_a_spent_budget_says_to_raise_it_before_the_retry() -> None:
    view = WatchView("db.sqlite", conversation_id=CONVERSATION)
    lines = view.apply(6, [run("failed", reason="budget_exceeded", error="the budget is spent", cost=0.00001, seq=6)])
    assert lines[1:] == [
        f"  raise the budget its error names first: tether budget --db db.sqlite (--conversation {CONVERSATION} | "
        f"--task {TASK}) --max-tokens N | --max-cost X | --clear",
        f"  then: tether retry --db db.sqlite {RUN}",
    ]
    text = screen(view, width=200)
    assert "12/3 $0.00001" in text and "e-05" not in text


def test_a_run_view_keeps_only_that_runs_records_and_its_task_tree() -> None:
    view = WatchView("tether.db", run_id=RUN)
    other_run = "r0000000-0000-7000-8000-000000000002"
    view.follow(run("running"))
    view.apply(
        3,
        [
            entry(0, "tether.user", {"text": "mine", "run_id": RUN}),
            entry(1, "tether.user", {"text": "theirs", "run_id": other_run}),
        ],
    )
    view.apply(
        4,
        [
            task(TASK, "agent:support", "running"),
            task("other-task", "agent:support", "running"),
            task("tool-1", "tool:lookup", "running", owner=TASK),
        ],
    )
    assert [e.data for e in view.entries(CONVERSATION)] == [{"text": "mine", "run_id": RUN}]
    assert set(view.tasks) == {TASK, "tool-1"}
    assert [(depth, t.task_id) for depth, t in view.task_tree(run("running"))] == [(0, TASK), (1, "tool-1")]


def test_the_compact_view_has_a_line_per_conversation() -> None:
    view = WatchView("tether.db")
    second = "c0000000-0000-7000-8000-000000000002"
    view.apply(2, [entry(0, "tether.user", {"text": "first question", "run_id": RUN})])
    view.apply(3, [entry(0, "tether.user", {"text": "second question", "run_id": "x"}, conversation_id=second)])
    view.apply(4, [run("running", seq=4)])
    text = screen(view)
    assert CONVERSATION in text and second in text and "first question" in text and "second question" in text


def test_the_transcript_is_bounded_and_shows_its_newest_lines_in_the_height() -> None:
    view = WatchView("tether.db", conversation_id=CONVERSATION)
    for position in range(MAX_ENTRIES_PER_CONVERSATION + 50):
        view.apply(position + 1, [entry(position, "tether.user", {"text": f"message {position}", "run_id": RUN})])
    held = view.entries(CONVERSATION)
    assert len(held) == MAX_ENTRIES_PER_CONVERSATION and held[-1].position == MAX_ENTRIES_PER_CONVERSATION + 49
    text = screen(view, height=20)
    assert f"message {MAX_ENTRIES_PER_CONVERSATION + 49}" in text and "earlier lines" in text
    assert len(text.rstrip("\n").splitlines()) <= 20


def test_a_json_line_has_the_records_fields_its_kind_and_its_commits_seq() -> None:
    line = json_line(entry(0, "tether.user", {"text": "hi"}), 42)
    assert line == (
        '{"entry_id": "e0", "conversation_id": "' + CONVERSATION + '", "position": 0, "seq": 42, '
        '"kind": "tether.user", "data": {"text": "hi"}, "created_at_ms": 0, "model": null, "head": null, '
        '"record": "entry"}'
    )


def test_the_header_says_when_the_owner_is_out_of_reach() -> None:
    view = approval_story()
    console = Console(file=io.StringIO(), width=120, height=40, record=True, color_system=None)
    console.print(render(view, console, connected=False))
    text = console.export_text()
    assert "seq 8  (owner unreachable: reconnecting)" in text
    assert "owner unreachable" not in screen(view)


def test_a_retried_runs_new_task_joins_the_run_view_though_it_comes_before_the_run_in_its_commit() -> None:
    view = WatchView("tether.db", run_id=RUN)
    view.follow(run("failed"))
    retried = attrs.evolve(run("pending", seq=20), task_id="t-retry")
    _, records = view.fold(20, [task("t-retry", "agent:support", "pending"), retried])
    assert [type(record).__name__ for record in records] == ["TaskRecord", "RunRecord"]  # commit order kept
    _, records = view.fold(21, [task("tool-9", "tool:lookup", "pending", owner="t-retry")])
    assert len(records) == 1
    assert [t.task_id for _, t in view.task_tree(retried)] == ["t-retry", "tool-9"]


def test_a_retried_runs_first_attempt_replaces_the_failed_runs_last_though_its_number_is_smaller() -> None:
    # retry_run starts the attempt numbers over: the new task's attempt 1 comes after the failed run's attempt 2.
    view = WatchView("tether.db", conversation_id=CONVERSATION)
    view.apply(3, [run("running", seq=3)])
    view.apply(4, [piece(0, "First try", seq=4)])
    view.apply(5, [piece(9, "", status="aborted", seq=5)])
    view.apply(6, [piece(0, "Second try", attempt=2, seq=6)])
    view.apply(7, [piece(10, "", attempt=2, status="aborted", seq=7), run("failed", reason="model_error", seq=7)])
    view.apply(9, [run("pending", seq=9)])
    lines = view.apply(10, [piece(0, "Again", seq=10)])
    assert lines == ["(attempt 2 replaced by attempt 1)", "streaming: Again"]
    text = screen(view)
    assert "assistant (streaming, attempt 1): Again" in text and "Second try" not in text


def test_a_failed_attempt_is_cut_off_once_whatever_the_order_of_its_commits_records() -> None:
    for first_the_operation in (True, False):
        view = WatchView("tether.db", conversation_id=CONVERSATION)
        view.apply(4, [piece(0, "Half an answ", seq=4)])
        records = [operation("failed", seq=5), piece(12, "", status="aborted", seq=5)]
        lines = view.apply(5, records if first_the_operation else records[::-1])
        assert len(lines) == 1 and lines[0].startswith("(cut off: attempt 1")
        [stream] = view.streams()
        assert (stream.text, stream.status) == ("Half an answ", "aborted")


def test_the_view_says_what_waits_in_the_inbox_and_what_went_unanswered() -> None:
    view = WatchView("tether.db", conversation_id=CONVERSATION)

    def submission(kind: str, status: str, payload: Any, **fields: Any) -> SubmissionRecord:
        fields.setdefault("submission_id", "s1")
        return SubmissionRecord(
            conversation_id=CONVERSATION,
            request_id="r",
            kind=kind,
            payload=JsonValue(payload),
            status=status,
            seq=2,
            created_at_ms=0,
            **fields,
        )

    lines = view.apply(
        2,
        [
            submission("input", "queued", "check B too", run_id=RUN, when_busy="steer"),
            submission("input", "queued", "and C", run_id=RUN),
            submission("input", "queued", "own run", submission_id=RUN, run_id=RUN),
            submission("reset", "queued", None, run_id=RUN),
            submission("write", "queued", {"kind": "app.note"}, run_id=RUN),
            submission("input", "unanswered", "late", run_id=RUN, reason="run_failed"),
            submission("continue", "unanswered", None, run_id=RUN, reason="nothing_to_answer"),
            submission("app.vote", "done", 1),
        ],
    )
    assert lines == [
        f"steer queued for run {RUN}: check B too",
        f"follow-up queued to join run {RUN}: and C",
        f"reset queued for run {RUN}'s next boundary",
        'write {"kind":"app.note"} waits behind a queued reset',
        "input late unanswered (run_failed)",
        "continue unanswered (nothing_to_answer)",
    ]


def test_a_tool_calls_progress_is_shown_as_the_tools_not_the_assistants() -> None:
    tool_op = "o0000000-0000-7000-8000-000000000009"
    view = WatchView("tether.db", conversation_id=CONVERSATION)
    view.apply(2, [run("running", seq=2)])
    view.apply(3, [operation("started", kind="tool", name="lookup", op=tool_op, seq=3)])
    assert view.apply(4, [piece(0, "looking up A1... ", op=tool_op, seq=4)]) == [
        "tool lookup progress: looking up A1... "
    ]
    assert "tool lookup (running, attempt 1): looking up A1..." in screen(view)
    view.apply(5, [piece(0, "the model says", seq=5)])  # a model's stream is still the assistant's
    assert "assistant (streaming, attempt 1): the model says" in screen(view)
    # The call's result ends its progress: the result entry shows it instead.
    view.apply(6, [operation("completed", kind="tool", name="lookup", op=tool_op, seq=6)])
    assert "tool lookup (running" not in screen(view)


def test_a_tools_handoff_reads_as_the_tools_and_a_clients_reset_as_a_reset() -> None:
    view = WatchView("tether.db", conversation_id=CONVERSATION)
    handoff = {"handoff": "We found A1.", "run_id": RUN, "operation_id": MODEL_OP, "name": "lookup"}
    assert view.apply(2, [entry(0, "tether.reset", handoff)]) == [
        "tool lookup handoff: the context starts again from: We found A1."
    ]
    client = {"handoff": "From here.", "submission_id": "s1"}
    assert view.apply(3, [entry(1, "tether.reset", client)]) == ["reset: the context starts again from: From here."]
    assert view.apply(4, [entry(2, "tether.reset", {"handoff": None, "submission_id": "s2"})]) == [
        "reset: the context starts again"
    ]


def test_a_task_label_says_whether_a_live_task_is_aborted_or_abandoned_and_how_it_ended() -> None:
    live = task("t0000000-0000-7000-8000-000000000009", "tool:look_up", "running")
    assert _task_label(attrs.evolve(live, abort="abort")).plain.endswith("running marked for abort")
    assert _task_label(attrs.evolve(live, abort="restart")).plain.endswith("running abandoned (restart)")
    ended = attrs.evolve(live, status="terminal", outcome=TaskOutcome(status="aborted", reason="restart"))
    assert _task_label(ended).plain.endswith("aborted (restart)")


def question_story(schema: Any) -> WatchView:
    """The approval story with a question in place of the approval: ``lookup`` asks, its call waits on the answer."""
    view = approval_story()
    view.apply(9, [question("open", schema=schema)])
    return view


def test_an_open_question_is_answered_with_a_json_value_of_its_schema_never_approve_or_deny() -> None:
    view = question_story({"type": "boolean"})
    interaction_id = "i0000000-0000-7000-8000-000000000001"
    [waiting] = view.attention()
    assert waiting.what == f"question {interaction_id}: lookup asks: Refund A1 in full?"
    schema = '{"type":"boolean"}'
    assert waiting.commands == (
        f"tether respond --db tether.db {interaction_id} --answer JSON   (a JSON value of the schema {schema})",
    )
    text = screen(view, width=160)
    assert "--approve" not in text and "--deny" not in text and "--answer JSON" in text
    assert "waiting for an answer" in text and "waiting for approval" not in text
    lines = WatchView("tether.db").apply(9, [question("open", schema=None)])
    assert lines == [
        f"question {interaction_id} waits: lookup asks: Refund A1 in full?",
        f"  tether respond --db tether.db {interaction_id} --answer JSON   (any JSON value; a text is '\"yes\"')",
    ]


def test_a_questions_schema_is_shown_cut_to_a_bounded_length() -> None:
    schema = {"type": "object", "properties": {f"field_{n}": {"type": "string"} for n in range(100)}}
    [waiting] = question_story(schema).attention()
    [command] = waiting.commands
    assert command.endswith("…)") and len(command) < 300


def test_a_questions_answer_is_shown_never_as_a_denial_and_an_approval_says_approved_or_denied() -> None:
    interaction_id = "i0000000-0000-7000-8000-000000000001"
    for value, shown in ((True, "true"), (False, "false"), ("not today", '"not today"')):
        view = question_story({"type": ["boolean", "string"]})
        assert view.apply(10, [question("answered", value=value)]) == [f"question {interaction_id} answered {shown}"]
        [assistant] = [e for e in view.entries(CONVERSATION) if e.kind == "tether.assistant"]
        [call] = view.tool_calls(assistant)
        assert call.status == f"answered {shown}"
        assert "denied" not in screen(view) and f"answered {shown}" in screen(view)
    [long] = question_story(None).apply(10, [question("answered", value="x" * 1_000)])
    assert long.endswith("…") and len(long) < 150
    for approve, shown in ((True, "approved"), (False, "denied")):
        assert approval_story().apply(9, [interaction("answered", approve=approve)]) == [
            f"approval {interaction_id} {shown}"
        ]


def test_an_aborted_answer_entry_shows_what_the_cut_off_attempt_said_marked_never_an_answer() -> None:
    view = WatchView("tether.db", conversation_id=CONVERSATION)
    view.apply(3, [run("running", seq=3)])
    said = {"run_id": RUN, "turn": 1, "operation_id": MODEL_OP, "attempt": 1, "ended": "interrupted", "text": "Half an"}
    assert view.apply(4, [entry(1, "tether.aborted_answer", said)]) == [
        "assistant (attempt 1, interrupted; not an answer, never sent to the model): Half an"
    ]
    failed = {**said, "attempt": 2, "ended": "failed", "text": "Cut", "truncated": True}
    assert view.apply(5, [entry(2, "tether.aborted_answer", failed)]) == [
        "assistant (attempt 2, failed; not an answer, never sent to the model): Cut…"
    ]
    view.apply(6, [entry(3, "tether.assistant", {"text": "Half an answer, whole.", "tool_calls": []})])
    text = screen(view)
    assert "assistant (attempt 1, interrupted): Half an  ✂ interrupted: not an answer, never sent to the model" in text
    assert "assistant (attempt 2, failed): Cut…" in text
    assert text.index("attempt 1, interrupted") < text.index("attempt 2, failed") < text.index("assistant: Half an ans")
    assert "assistant: Half an\n" not in text
