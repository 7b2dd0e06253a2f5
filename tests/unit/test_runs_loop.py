"""The run loop's pure parts (actors/_worker/_messages.py, _journal.py): the transcript as a model's messages,
derived ids, and what an app announces for its agents and tools."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import actors
import protocol
from actors._models._retry import backoff_ms, next_delay_ms
from actors._worker._agent_run import _answerable
from actors._worker._journal import model_operation_id, tool_operation_id
from actors._worker._messages import CUT_OFF, INTERRUPTED, MessageFold, context_fold, transcript_messages, was_cut_off
from actors._worker._partials import aborted_answer
from protocol import MAX_ABORTED_ANSWER_BYTES, Capability, EntryRecord, JsonValue, aborted_answer_data
from tests.unit._records import operation_record, partial_record


def entry(position: int, kind: str, data: Any) -> EntryRecord:
    return EntryRecord(
        entry_id=protocol.new_id(),
        conversation_id="c",
        position=position,
        seq=position + 1,
        kind=kind,
        data=JsonValue(data),
        created_at_ms=0,
    )


def call(call_id: str, name: str = "lookup") -> dict[str, Any]:
    return {"call_id": call_id, "name": name, "arguments": {"order_id": "A1"}}


def test_transcript_pairs_results_in_call_order_and_synthesizes_orphans() -> None:
    entries = [
        entry(0, "tether.user", {"text": "hi", "run_id": "r"}),
        entry(1, "tether.assistant", {"text": "", "tool_calls": [call("call_1_1"), call("call_1_2")]}),
        entry(2, "tether.tool_result", {"call_id": "call_1_2", "content": "two", "is_error": False}),
        entry(3, "note", {"anything": 1}),
        entry(4, "tether.user", {"text": "again", "run_id": "s"}),
        entry(5, "tether.assistant", {"text": "", "tool_calls": [call("call_1_1")]}),
    ]
    messages = transcript_messages(entries)
    assert messages == [
        actors.UserMessage(text="hi"),
        actors.AssistantMessage(
            tool_calls=(
                actors.ToolCallRequest(call_id="call_1_1", name="lookup", arguments={"order_id": "A1"}),
                actors.ToolCallRequest(call_id="call_1_2", name="lookup", arguments={"order_id": "A1"}),
            )
        ),
        actors.ToolMessage(call_id="call_1_1", content=INTERRUPTED, is_error=True),
        actors.ToolMessage(call_id="call_1_2", content="two"),
        actors.UserMessage(text="again"),
        actors.AssistantMessage(
            tool_calls=(actors.ToolCallRequest(call_id="call_1_1", name="lookup", arguments={"order_id": "A1"}),)
        ),
        actors.ToolMessage(call_id="call_1_1", content=INTERRUPTED, is_error=True),
    ]


def visible(position: int, kind: str, model: Any, head: str | None = None) -> EntryRecord:
    return attrs.evolve(entry(position, kind, {"app": position}), model=JsonValue(model), head=head)


def test_an_entry_of_the_applications_kind_shows_the_model_what_it_carries_in_its_place() -> None:
    entries = [
        entry(0, "tether.user", {"text": "hi", "run_id": "r"}),
        entry(1, "tether.assistant", {"text": "", "tool_calls": [call("c1")]}),
        visible(2, "chat.mention", [{"role": "user", "text": "ann: and B?"}]),  # a steer placed mid-round
        entry(3, "tether.tool_result", {"call_id": "c1", "content": "one", "is_error": False}),
        visible(4, "app.context", [{"role": "user", "text": "note"}, {"role": "assistant", "text": "noted"}]),
        entry(5, "app.plain", {"n": 1}),  # nothing for the model
    ]
    assert transcript_messages(entries) == [
        actors.UserMessage(text="hi"),
        actors.AssistantMessage(
            tool_calls=(actors.ToolCallRequest(call_id="c1", name="lookup", arguments={"order_id": "A1"}),)
        ),
        actors.ToolMessage(call_id="c1", content="one"),
        actors.UserMessage(text="ann: and B?"),  # after the round's result, where the round ended
        actors.UserMessage(text="note"),
        actors.AssistantMessage(text="noted"),
    ]


def test_an_entry_naming_a_head_starts_the_context_there_with_its_messages_first() -> None:
    entries = [
        entry(0, "tether.user", {"text": "old question"}),
        entry(1, "tether.assistant", {"text": "old answer", "tool_calls": []}),
        entry(2, "tether.user", {"text": "kept question"}),
        entry(3, "tether.assistant", {"text": "kept answer", "tool_calls": []}),
    ]
    summary = visible(4, "app.summary", [{"role": "user", "text": "Summary: an old question was answered."}])
    entries.append(attrs.evolve(summary, head=entries[2].entry_id))
    entries.append(entry(5, "tether.user", {"text": "new question"}))
    expected = [
        actors.UserMessage(text="Summary: an old question was answered."),
        actors.UserMessage(text="kept question"),
        actors.AssistantMessage(text="kept answer"),
        actors.UserMessage(text="new question"),
    ]
    assert transcript_messages(entries) == expected
    # Fed in parts (the run loop's fold, beside the worker's transcript cache): the same, whatever the cut.
    for cut in range(len(entries) + 1):
        fold = context_fold(entries[:cut], MessageFold())
        assert context_fold(entries, fold).messages() == expected, cut
    # A reset after it starts the context again; a head before the reset is not looked for.
    entries.append(entry(6, "tether.reset", {"handoff": "From here."}))
    assert transcript_messages(entries) == [actors.UserMessage(text="From here.")]


def test_invalid_arguments_survive_the_transcript() -> None:
    bad = {"call_id": "call_1_1", "name": "lookup", "arguments": "{no", "invalid_arguments": "not JSON"}
    entries = [entry(0, "tether.assistant", {"text": "t", "tool_calls": [bad]})]
    [assistant, result] = transcript_messages(entries)
    assert isinstance(assistant, actors.AssistantMessage)
    assert assistant.tool_calls[0].invalid_arguments == "not JSON" and result.role == "tool"


def test_ids_are_derived() -> None:
    assert model_operation_id("r", 1) == model_operation_id("r", 1) != model_operation_id("r", 2)
    assert tool_operation_id("r", 1, "call_1_1") != tool_operation_id("s", 1, "call_1_1")
    assert protocol.is_id(model_operation_id("r", 1))


async def handler(call: actors.ToolCall, args: dict[str, Any]) -> Any:
    return None


def test_capabilities_announce_agents_and_tools() -> None:
    app = actors.App("a")
    app.define_tool("lookup", handler, description="d", parameters={"type": "object"}, version=3)
    app.define_agent(
        "support", version=2, model=actors.ScriptedModel([actors.ScriptedTurn(text="x")]), tools=["lookup"]
    )
    assert app.capabilities() == (
        Capability(kind="agent", name="support", version=2),
        Capability(kind="tool", name="lookup", version=3),
    )


def test_restart_limits_are_per_tool_per_agent_per_task_kind_or_the_apps_and_none_is_no_limit() -> None:
    app = actors.App("a", restart_limit=3)
    for name, limit in (("own", 2), ("unlimited", None)):
        app.define_tool(name, handler, description="d", parameters={"type": "object"}, restart_limit=limit)
    app.define_tool("plain", handler, description="d", parameters={"type": "object"})
    model = actors.ScriptedModel([actors.ScriptedTurn(text="x")])
    app.define_agent("patient", version=1, model=model, restart_limit=None)
    app.define_agent("plain", version=1, model=model)
    app.define_task("k.own", version=1, initial=lambda _: {}, phases={"p": handler}, restart_limit=7)
    app.define_task("k.plain", version=1, initial=lambda _: {}, phases={"p": handler})
    limits = {(found.kind, found.name): found.restart_limit for found in app.capabilities()}
    assert limits == {
        ("task", "k.own"): 7,
        ("task", "k.plain"): 3,
        ("agent", "patient"): None,
        ("agent", "plain"): 3,
        ("tool", "own"): 2,
        ("tool", "plain"): 3,
        ("tool", "unlimited"): None,
    }
    assert actors.App("b").restart_limit == 5 and actors.App("c", restart_limit=None).restart_limit is None
    for bad in (0, -1, True, 2.0, protocol.MAX_RESTART_LIMIT + 1, "5"):
        with pytest.raises(actors.UsageError, match="restart_limit is a whole number of cut-off phases"):
            app.define_tool(f"t{id(bad)}", handler, description="d", parameters={"type": "object"}, restart_limit=bad)  # type: ignore[arg-type]
        with pytest.raises(actors.UsageError, match="restart_limit"):
            actors.App("d", restart_limit=bad)  # type: ignore[arg-type]
        with pytest.raises(actors.UsageError, match="restart_limit"):
            app.define_agent(f"a{id(bad)}", version=1, model=model, restart_limit=bad)  # type: ignore[arg-type]
    assert (sorted(app.tools), sorted(app.agents)) == (["own", "plain", "unlimited"], ["patient", "plain"])  # none kept


def test_one_delay_formula() -> None:
    retry = actors.Retry(attempts=5, first_delay_ms=300, max_delay_ms=5000, multiplier=3.0)
    stored = retry.to_protocol()
    assert stored == protocol.Retry(attempts=5, first_delay_ms=300, max_delay_ms=5000, multiplier=3.0)
    for attempt in range(1, 5):
        assert retry.delay_ms(attempt) == protocol.retry_delay_ms(stored, attempt) == backoff_ms(stored, attempt)
        assert next_delay_ms(stored, attempt) == backoff_ms(stored, attempt)
    # After the last attempt there is no next one, whatever the error or the provider's Retry-After.
    assert retry.delay_ms(5) is None and next_delay_ms(stored, 5) is None
    assert next_delay_ms(stored, 5, retry_after_ms=2000) is None
    assert backoff_ms(stored, 1, retry_after_ms=2000) == 2000
    assert backoff_ms(stored, 1, retry_after_ms=60_000) == 5000


def test_a_fold_fed_in_parts_gives_the_whole_transcripts_messages_and_digest() -> None:
    from actors._worker._journal import digest
    from actors._worker._messages import MessageFold, _message_data, request_digest

    entries = [
        entry(0, "tether.user", {"text": "hi", "run_id": "r"}),
        entry(1, "tether.assistant", {"text": "", "tool_calls": [call("call_1_1"), call("call_1_2")]}),
        entry(2, "tether.tool_result", {"call_id": "call_1_2", "content": "two", "is_error": False}),
        entry(3, "note", {"anything": 1}),
        entry(4, "tether.tool_result", {"call_id": "call_1_1", "content": "one", "is_error": True}),
        entry(5, "tether.assistant", {"text": 'ünï "messages":[]', "tool_calls": [call("call_2_1")]}),
        entry(6, "tether.user", {"text": "again", "run_id": "s"}),
        entry(7, "tether.assistant", {"text": "", "tool_calls": [call("call_3_1")]}),
        entry(8, "tether.tool_result", {"call_id": "call_3_1", "content": {"n": 1}, "is_error": False}),
    ]
    app = actors.App("a")
    app.define_tool("lookup", handler, description="d", parameters={"type": "object"})
    agent = app.define_agent(
        "helper",
        version=1,
        model=actors.ScriptedModel([actors.ScriptedTurn(text="t")]),
        instructions='Be "brief".',
        tools=["lookup"],
    )
    for cut in range(len(entries) + 1):
        fold = MessageFold()
        fold.feed(entries[:cut])
        before = fold.messages()
        fold.feed(entries[cut:])
        whole = transcript_messages(entries)
        assert transcript_messages(entries[:cut]) == before
        assert fold.messages() == whole and fold.fed == len(entries)
        request = agent.request(fold.messages(), 2)
        expected = digest(
            {
                "model": request.model,
                "instructions": request.instructions,
                "messages": [_message_data(message) for message in request.messages],
                "tools": [tool.name for tool in request.tools],
            }
        )
        assert request_digest(request, fold) == request_digest(request) == expected
    # Messages that are not the fold's own (a request built otherwise): the digest is of what the request holds.
    other = agent.request(transcript_messages(entries[:2]), 1)
    assert request_digest(other, fold) == request_digest(other)


def test_a_tools_handoff_starts_the_context_again_keeping_what_was_placed_as_its_round_ended() -> None:
    from actors._worker._journal import digest
    from actors._worker._messages import _message_data, request_digest

    handoff = {"handoff": "We found order A1.", "run_id": "r", "operation_id": "op-2", "name": "lookup"}
    entries = [
        entry(0, "tether.user", {"text": "hi", "run_id": "r"}),
        entry(1, "tether.assistant", {"run_id": "r", "text": "", "tool_calls": [call("c1"), call("c2")]}),
        entry(2, "tether.tool_result", {"call_id": "c1", "content": "one", "is_error": False}),
        entry(3, "tether.user", {"text": "and B?", "run_id": "r", "submission_id": "s"}),  # a steer mid-round
        entry(4, "tether.tool_result", {"call_id": "c2", "content": "two", "is_error": False}),  # (the run wrote it)
        entry(5, "tether.user", {"text": "and C?", "run_id": "r", "submission_id": "t"}),  # placed as it ended
        visible(6, "app.context", [{"role": "user", "text": "note"}, {"role": "assistant", "text": "noted"}]),
        entry(7, "app.plain", {"n": 1}),  # nothing for the model
        entry(8, "tether.reset", handoff),
        entry(9, "tether.assistant", {"run_id": "r", "text": "Done.", "tool_calls": []}),
    ]
    expected = [
        actors.UserMessage(text="We found order A1."),
        actors.UserMessage(text="and B?"),
        actors.UserMessage(text="and C?"),
        actors.UserMessage(text="note"),
        actors.AssistantMessage(text="noted"),
        actors.AssistantMessage(text="Done."),
    ]
    assert transcript_messages(entries) == expected
    # The steer whose round still missed a result (c2's, written by the run with the reset) is kept too.
    waiting = [entries[0], entries[1], entries[2], entries[3], entries[4], entries[8]]
    assert transcript_messages(waiting) == expected[:2]
    # A client's reset (it names its submission) keeps nothing of the context before it.
    client = [*entries[:8], entry(8, "tether.reset", {"handoff": "From here.", "submission_id": "u"})]
    assert transcript_messages(client) == [actors.UserMessage(text="From here.")]
    assert transcript_messages([*entries[:8], entry(8, "tether.reset", {"handoff": None, "submission_id": "u"})]) == []
    # Fed in parts (the run loop's fold): the same messages and digest as the whole, whatever the cuts.
    agent = actors.App("a").define_agent("helper", version=1, model=actors.ScriptedModel([actors.ScriptedTurn()]))
    for cut in range(len(entries) + 1):
        for second in range(cut, len(entries) + 1):
            fold = context_fold(entries[:cut], MessageFold())
            fold = context_fold(entries[:second], fold)
            assert fold.messages() == transcript_messages(entries[:second]), (cut, second)
            fold = context_fold(entries, fold)
            assert fold.messages() == expected and fold.fed == len(entries), (cut, second)
            request = agent.request(fold.messages(), 2)
            whole = [_message_data(message) for message in request.messages]
            expected_digest = digest({"model": request.model, "instructions": "", "messages": whole, "tools": []})
            assert request_digest(request, fold) == request_digest(request) == expected_digest


def test_an_answer_cut_off_with_calls_leaves_a_context_that_ends_in_their_error_results_and_can_be_continued() -> None:
    cut = {"text": "Let me", "tool_calls": [call("c1"), call("c2")], "cut_off": True}
    entries = [
        entry(0, "tether.user", {"text": "hi", "run_id": "r"}),
        entry(1, "tether.assistant", {"run_id": "r", "turn": 1, **cut}),
        entry(2, "tether.tool_result", {"call_id": "c1", "content": CUT_OFF, "is_error": True, "code": "cut_off"}),
        entry(3, "tether.tool_result", {"call_id": "c2", "content": CUT_OFF, "is_error": True, "code": "cut_off"}),
    ]
    messages = transcript_messages(entries)
    assert messages[-2:] == [
        actors.ToolMessage(call_id="c1", content=CUT_OFF, is_error=True),
        actors.ToolMessage(call_id="c2", content=CUT_OFF, is_error=True),
    ]
    assert _answerable(messages)  # a continue makes a request: every call has its result
    assert was_cut_off(cut) and was_cut_off(entries[1].data)
    assert not was_cut_off({"text": "done", "tool_calls": []}) and not was_cut_off(None)
    # A text answer cut off is an answer: a continue finds nothing to answer.
    text_only = [entries[0], entry(1, "tether.assistant", {"text": "Let me", "tool_calls": [], "cut_off": True})]
    assert not _answerable(transcript_messages(text_only))
    assert "cut_off" in protocol.TOOL_ERROR_CODES


def test_an_aborted_answer_is_kept_only_for_an_interrupted_attempt_that_streamed_text_still_its_own() -> None:
    interrupted = operation_record("interrupted", seq=5, attempt=2)
    said = partial_record(0, "Your order A1 le", seq=4, attempt=2, status="aborted")
    assert aborted_answer(interrupted, [said]) == {
        "run_id": "r",
        "turn": 1,
        "operation_id": "op",
        "attempt": 2,
        "ended": "interrupted",
        "text": "Your order A1 le",
    }
    assert aborted_answer(None, [said]) is None  # the first attempt: nothing came before it
    assert aborted_answer(interrupted, []) is None  # it streamed nothing: no entry
    assert aborted_answer(interrupted, [attrs.evolve(said, text="", offset=16)]) is None  # its pieces were dropped
    # A close gave it back (withdrawn at the attempt before the stopped one: it is sent again as that attempt).
    assert aborted_answer(attrs.evolve(interrupted, attempt=1), [said]) is None
    # A later attempt started (and streamed nothing) since: the cut-off one's entry went with that attempt's intent.
    assert aborted_answer(attrs.evolve(interrupted, attempt=3), [said]) is None
    assert aborted_answer(interrupted, [attrs.evolve(said, status="streaming")]) is None
    # A failed attempt keeps its entry in its failure's commit; a completed one has its answer.
    assert aborted_answer(attrs.evolve(interrupted, status="failed"), [said]) is None
    assert aborted_answer(attrs.evolve(interrupted, status="completed"), [said]) is None
    assert aborted_answer(attrs.evolve(interrupted, kind="tool"), [said]) is None


def test_an_aborted_answers_text_is_bounded_at_a_character() -> None:
    text = "é" * MAX_ABORTED_ANSWER_BYTES
    data = aborted_answer_data(run_id="r", turn=1, operation_id="op", attempt=1, ended="failed", text=text)
    assert data["truncated"] is True and len(data["text"].encode()) <= MAX_ABORTED_ANSWER_BYTES
    assert text.startswith(data["text"]) and len(data["text"]) == MAX_ABORTED_ANSWER_BYTES // 2
    assert "truncated" not in aborted_answer_data(
        run_id="r", turn=1, operation_id="op", attempt=1, ended="failed", text="short"
    )


def test_an_aborted_answer_is_never_sent_to_the_model() -> None:
    aborted = {"run_id": "r", "turn": 1, "operation_id": "op", "attempt": 1, "ended": "interrupted", "text": "Half"}
    entries = [
        entry(0, "tether.user", {"text": "hi", "run_id": "r"}),
        entry(1, "tether.aborted_answer", aborted),
        entry(2, "tether.assistant", {"text": "", "tool_calls": [call("c1")]}),
        entry(3, "tether.aborted_answer", {**aborted, "turn": 2}),  # cut off while the round's result was missing
        entry(4, "tether.tool_result", {"call_id": "c1", "content": "one", "is_error": False}),
        entry(5, "tether.aborted_answer", {**aborted, "turn": 3}),
    ]
    expected = [
        actors.UserMessage(text="hi"),
        actors.AssistantMessage(
            tool_calls=(actors.ToolCallRequest(call_id="c1", name="lookup", arguments={"order_id": "A1"}),)
        ),
        actors.ToolMessage(call_id="c1", content="one"),
    ]
    assert transcript_messages(entries) == expected
    without = [e for e in entries if e.kind != "tether.aborted_answer"]
    fold, plain = context_fold(entries, MessageFold()), context_fold(without, MessageFold())
    assert fold.final_json == plain.final_json  # the request's digest is the same as without them
    assert _answerable(fold.messages())
