"""A conversation's transcript as a model's messages: the entries of its current context (from the last reset on,
its handoff text the first user message, then, for a tool's handoff, what was placed when its round ended; or from
the head the last entry naming one names, that entry's messages first) folded into user, assistant and tool messages:
the ``tether.*`` entries, and what an entry of the application's kind carries for the model (``model``: an input
placed as its own entry, a write the model sees). A call without a result gets an ``interrupted`` error result; a
``tether.aborted_answer`` (what a cut-off attempt had streamed) is never sent. Folded
a part at a time beside the worker's transcript cache, with the digest of a model request that its intent records."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, Final

from protocol import (
    ABORTED_ANSWER_ENTRY,
    ASSISTANT_ENTRY,
    RESERVED_ENTRY_PREFIX,
    RESET_ENTRY,
    TOOL_RESULT_ENTRY,
    USER_ENTRY,
    EntryRecord,
    digest_json,
)

from .._models._model import AssistantMessage, Message, ModelRequest, ToolCallRequest, ToolMessage, UserMessage
from ._transcript import transcript_cache

INTERRUPTED: Final = "interrupted: the tool call has no result (its run was interrupted before it finished)"
LENGTH: Final = "length"
"""The finish reason of an answer cut off at its output limit (:data:`~actors.FinishReason`)."""
CUT_OFF: Final = (
    "error: the answer was cut off before the call was complete (the model reached its output limit); the call was "
    "not run"
)
"""The error result of each tool call of an answer cut off at its output limit (code ``cut_off``): it never ran."""


def call_data(call: ToolCallRequest) -> dict[str, Any]:
    data: dict[str, Any] = {"call_id": call.call_id, "name": call.name, "arguments": call.arguments}
    if call.invalid_arguments is not None:
        data["invalid_arguments"] = call.invalid_arguments
    return data


def assistant_data(message: AssistantMessage) -> dict[str, Any]:
    """The normalised assistant message as JSON: the model operation's result and the entry's data."""
    return {"text": message.text, "tool_calls": [call_data(call) for call in message.tool_calls]}


def was_cut_off(data: Any) -> bool:
    """Whether a model request's result (or its ``tether.assistant`` entry's data) is an answer cut off at its output
    limit (``cut_off``: its tool calls never ran; each has a ``cut_off`` error result)."""
    return isinstance(data, dict) and data.get("cut_off") is True


def _assistant_message(data: Any) -> AssistantMessage:
    calls = tuple(
        ToolCallRequest(
            call_id=str(call["call_id"]),
            name=str(call["name"]),
            arguments=call["arguments"],
            invalid_arguments=call.get("invalid_arguments"),
        )
        for call in data.get("tool_calls") or ()
    )
    return AssistantMessage(text=str(data.get("text") or ""), tool_calls=calls)


def transcript_messages(entries: Iterable[Any]) -> list[Message]:
    """The transcript's ``tether.*`` entries as a model's messages, oldest first. Each assistant message is followed
    by the results of its calls in call order; a call without a result entry gets a synthesized error result
    (``interrupted``), so a provider never sees a dangling call. Other entry kinds are not the model's."""
    return context_fold(list(entries), MessageFold()).messages()


def context_fold(entries: Sequence[Any], fold: MessageFold) -> MessageFold:
    """``fold`` (of ``entries[:fold.fed]``) fed the rest of ``entries``; a new fold from a head instead, when an entry
    naming one came after what ``fold`` had read (and after the last reset among them): its messages first, then the
    entries from the head on. Only the entries ``fold`` has not read are looked at."""
    for index in range(len(entries) - 1, fold.fed - 1, -1):
        entry = entries[index]
        if entry.kind == RESET_ENTRY:
            break  # a reset after it starts the context again anyway
        head = getattr(entry, "head", None)
        if head is not None:
            start = next((i for i in range(index - 1, -1, -1) if entries[i].entry_id == head), None)
            if start is not None:  # (the owner places no head outside the context: stale)
                fold = MessageFold(summary=entry)
                fold.fed = start
            break
    fold.feed(entries[fold.fed :])
    return fold


class MessageFold:
    """:func:`transcript_messages` fed a transcript in parts: the messages of the entries fed so far, each entry
    read once. Messages before the last user or assistant message are final; the results of the last assistant
    message's calls are settled only by :meth:`messages`, each time (a result entry may still come). The run loop
    keeps one per conversation beside the worker's transcript cache, so a turn folds only the new entries, and
    keeps each final message's canonical JSON for the request's digest."""

    def __init__(self, summary: Any = None) -> None:
        self.fed = 0
        """Entries fed so far (from the first: a fold from a head starts with it at the head's index)."""
        self.final: list[Message] = []
        self.final_json: list[str] = []
        """The canonical JSON of each final message (:func:`request_digest`), computed once."""
        self.json_bytes = 0
        """The UTF-8 size of :attr:`final_json`: what the fold holds beside the transcript (its messages share the
        entries' strings), charged to the transcript cache's bound."""
        self._open_calls: tuple[ToolCallRequest, ...] = ()
        self._results: dict[str, ToolMessage] = {}
        self._steers: list[UserMessage] = []
        """User messages that came while the last calls had results missing (a steer placed when the tool round
        ended, before the run wrote the result of a call that was cut off or resolved by a person): the model sees
        them after those results, where the round ended."""
        self._skip = None if summary is None else summary.entry_id
        """The entry naming the head this fold starts at: its messages came first, not in its place."""
        if summary is not None:
            self._visible(summary.model)

    def feed(self, entries: Iterable[Any]) -> None:
        for entry in entries:
            self.fed += 1
            data = entry.data if isinstance(entry.data, dict) else {}
            if entry.kind == USER_ENTRY:
                self._user(UserMessage(text=str(data.get("text") or "")))
            elif entry.kind == ASSISTANT_ENTRY:
                self._close()
                message = _assistant_message(data)
                self._final(message)
                self._open_calls = message.tool_calls
            elif entry.kind == RESET_ENTRY:
                # The context starts again here, from the handoff text when there is one. A tool's handoff (placed
                # by its run, naming it) keeps what the owner placed when the round ended, before it: its steers and
                # the writes the model sees.
                kept = _after_round(self.messages()) if data.get("run_id") is not None else []
                self.final, self.final_json, self.json_bytes = [], [], 0
                self._open_calls, self._results, self._steers = (), {}, []
                handoff = data.get("handoff")
                if isinstance(handoff, str) and handoff:
                    self._final(UserMessage(text=handoff))
                for kept_message in kept:
                    self._final(kept_message)
            elif entry.kind == TOOL_RESULT_ENTRY:
                call_id = str(data.get("call_id"))
                if any(call.call_id == call_id for call in self._open_calls) and call_id not in self._results:
                    self._results[call_id] = ToolMessage(
                        call_id=call_id, content=str(data.get("content", "")), is_error=bool(data.get("is_error"))
                    )
            elif entry.kind == ABORTED_ANSWER_ENTRY:
                pass  # what a cut-off attempt had streamed: for people only, never an answer the model reads
            elif not entry.kind.startswith(RESERVED_ENTRY_PREFIX) and entry.entry_id != self._skip:
                self._visible(getattr(entry, "model", None))

    def _user(self, user: UserMessage) -> None:
        """A user message: after the last calls' results, or waiting for them (a steer placed mid-round)."""
        if self._open_calls and len(self._results) < len(self._open_calls):
            self._steers.append(user)
        else:
            self._close()
            self._final(user)

    def _visible(self, model: Any) -> None:
        """What the model sees of an entry of the application's kind (checked by the owner as it placed it)."""
        for message in model if isinstance(model, list) else ():
            text = str(message.get("text") or "") if isinstance(message, dict) else ""
            if isinstance(message, dict) and message.get("role") == "assistant":
                self._close()
                self._final(AssistantMessage(text=text))
            else:
                self._user(UserMessage(text=text))

    def messages(self) -> list[Message]:
        """The messages of every entry fed so far, the last calls' results settled (or ``interrupted``), then the
        user messages that came before all of them did."""
        return self.final + self._settled() + self._steers

    def _settled(self) -> list[Message]:
        return [
            self._results.get(call.call_id) or ToolMessage(call_id=call.call_id, content=INTERRUPTED, is_error=True)
            for call in self._open_calls
        ]

    def _close(self) -> None:
        for message in [*self._settled(), *self._steers]:
            self._final(message)
        self._open_calls, self._results, self._steers = (), {}, []

    def _final(self, message: Message) -> None:
        self.final.append(message)
        text = digest_json(_message_data(message))
        self.final_json.append(text)
        self.json_bytes += len(text.encode())


def _after_round(messages: Sequence[Message]) -> list[Message]:
    """The messages after the last tool result (those placed when the round ended); none without one."""
    for index in range(len(messages) - 1, -1, -1):
        if isinstance(messages[index], ToolMessage):
            return list(messages[index + 1 :])
    return []


def request_digest(request: ModelRequest, fold: MessageFold | None = None) -> str:
    """The sha256 of the request as canonical JSON (model, instructions, messages, tool names): what a model
    intent records. With the ``fold`` the messages came from, the final messages' JSON is not computed again (the
    same bytes as :func:`digest` of the whole request)."""
    value = {
        "model": request.model,
        "instructions": request.instructions,
        "messages": [],
        "tools": [tool.name for tool in request.tools],
    }
    messages = request.messages
    known: list[str] = []
    final = fold.final if fold is not None else []
    if fold is not None and len(messages) >= len(final) and all(a is b for a, b in zip(final, messages, strict=False)):
        known = fold.final_json
    rest = [digest_json(_message_data(message)) for message in messages[len(known) :]]
    head, tail = digest_json(value).split('"messages":[]', 1)
    return hashlib.sha256(f'{head}"messages":[{",".join(known + rest)}]{tail}'.encode()).hexdigest()


def message_fold(client: Any, conversation_id: str, entries: Sequence[EntryRecord]) -> MessageFold:
    """The conversation's :class:`MessageFold` fed ``entries`` (its whole transcript, as the worker's cache returned
    it): kept beside the cache, so only the entries after the last fold are read; a fresh one when the cache read the
    transcript whole since (its memo is then empty). What it holds is charged to the cache's byte bound."""
    cache = transcript_cache(client)
    memo = cache.memo(conversation_id)
    fold = memo.get("fold")
    if not isinstance(fold, MessageFold) or fold.fed > len(entries):
        fold = MessageFold()
    fold = context_fold(entries, fold)
    memo["fold"] = fold
    cache.charge(conversation_id, fold.json_bytes)
    return fold


def _message_data(message: Message) -> dict[str, Any]:
    if isinstance(message, UserMessage):
        return {"role": "user", "text": message.text}
    if isinstance(message, AssistantMessage):
        return {"role": "assistant", **assistant_data(message)}
    return {"role": "tool", "call_id": message.call_id, "content": message.content, "is_error": message.is_error}
