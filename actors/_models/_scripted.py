"""``actors.ScriptedModel``: a deterministic model for tests and the demo (no network, no key)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, Final

import attrs
import trio

from protocol import UsageError

from ._model import (
    AssistantMessage,
    Finish,
    FinishReason,
    Message,
    ModelError,
    ModelRequest,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolMessage,
    Usage,
    UsageReport,
    UserMessage,
)

DEFAULT_CHUNK_CHARS: Final = 8


def count_tokens(text_chars: int) -> int:
    """The scripted model's token count for ``text_chars`` characters: one token per 4 characters, rounded up."""
    return -(-text_chars // 4)


def transcript_chars(request: ModelRequest) -> int:
    """The characters of what a request sends: instructions, message texts and tool-call arguments."""
    total = len(request.instructions)
    for message in request.messages:
        match message:
            case UserMessage(text=text):
                total += len(text)
            case AssistantMessage(text=text, tool_calls=calls):
                total += len(text) + sum(len(_arguments_text(call.arguments)) for call in calls)
            case ToolMessage(content=content):
                total += len(content)
    return total


def _arguments_text(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, separators=(",", ":"))


def turn_index(messages: Sequence[Message]) -> int:
    """Which model request of its run ``messages`` is for (0 for the first): the number of assistant messages
    after the last user message."""
    count = 0
    for message in reversed(messages):
        if isinstance(message, UserMessage):
            break
        if isinstance(message, AssistantMessage):
            count += 1
    return count


def _scripted_calls(value: Iterable[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
    calls = tuple((name, arguments) for name, arguments in value)
    for name, _ in calls:
        if not isinstance(name, str) or not name:
            raise UsageError(f"a scripted tool call needs a tool name, not {name!r}")
    return calls


@attrs.frozen(kw_only=True)
class ScriptedTurn:
    """One answer of a :class:`ScriptedModel`.

    ``tool_calls`` are ``(name, args)`` pairs: ``args`` is sent as its JSON text, or verbatim when it is a ``str``
    (to script arguments that are not valid JSON). ``usage`` defaults to a count of 4 characters per token.
    Attempts ``1..fail_attempts`` of this turn fail: after streaming ``cut_after_chars`` characters of the text
    with a retryable ``cut_stream`` error when that is set, or else at once with a :class:`ModelError` of kind
    ``error`` (carrying ``retry_after_ms``); later attempts answer. ``delay_s`` sleeps before each chunk (a slow
    stream, for cancellation tests); text and arguments are streamed ``chunk_chars`` characters at a time.
    """

    text: str = ""
    tool_calls: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=_scripted_calls)
    usage: Usage | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    fail_attempts: int = 0
    cut_after_chars: int | None = None
    retry_after_ms: int | None = None
    delay_s: float = 0.0
    chunk_chars: int = DEFAULT_CHUNK_CHARS

    def __attrs_post_init__(self) -> None:
        fails = self.error is not None or self.cut_after_chars is not None
        if fails and self.fail_attempts < 1:
            raise UsageError("a failing scripted turn needs fail_attempts=N: attempts 1..N fail, later ones answer")
        if self.fail_attempts and not fails:
            raise UsageError("fail_attempts needs error=KIND or cut_after_chars=N to say how the attempts fail")
        if self.cut_after_chars is not None and (self.error or "cut_stream") != "cut_stream":
            raise UsageError(f"cut_after_chars always fails with cut_stream, not {self.error!r}")
        if self.cut_after_chars is not None and self.cut_after_chars < 0:
            raise UsageError(f"cut_after_chars cannot be negative ({self.cut_after_chars})")
        if self.chunk_chars < 1:
            raise UsageError(f"chunk_chars must be 1 or more, not {self.chunk_chars}")
        if not self.delay_s >= 0:
            raise UsageError(f"delay_s cannot be negative ({self.delay_s})")


def _turns(value: Iterable[ScriptedTurn]) -> tuple[ScriptedTurn, ...]:
    turns = tuple(value)
    if not turns:
        raise UsageError("a ScriptedModel needs at least one ScriptedTurn")
    for turn in turns:
        if not isinstance(turn, ScriptedTurn):
            raise UsageError(f"a ScriptedModel's turns are ScriptedTurn records, not {type(turn).__name__}")
    return turns


@attrs.frozen
class ScriptedModel:
    """A deterministic model for tests and the demo (no network, no key).

    Turn ``i`` answers the ``i``-th model request of a run, and ``i`` is read from the request itself (its ``turn``,
    as the run loop counts; for a request made outside a run, the assistant messages after the last user message,
    see :func:`turn_index`), so a request answers the same after any restart, every run of a conversation replays
    the script from its first turn, and a steer placed mid-run (a user message) does not start it over. Call ids are
    ``call_<turn>_<position>`` (from 1). A request past the last turn fails with a final ``script_exhausted`` error.
    """

    turns: tuple[ScriptedTurn, ...] = attrs.field(converter=_turns)
    name: str = attrs.field(default="scripted", kw_only=True)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        index = request.turn - 1 if request.turn is not None else turn_index(request.messages)
        if index >= len(self.turns):
            raise ModelError(
                f"the scripted model {self.name!r} has {len(self.turns)} turn(s) and was asked for turn {index + 1} "
                "of this run; add turns to the script (or end the run sooner)",
                kind="script_exhausted",
            )
        turn = self.turns[index]
        failing = request.attempt <= turn.fail_attempts
        if turn.delay_s <= 0:
            await _checkpoint()
        if failing and turn.cut_after_chars is None:
            raise ModelError(
                f"scripted failure of turn {index + 1}, attempt {request.attempt}",
                kind=turn.error or "server_error",
                retry_after_ms=turn.retry_after_ms,
            )
        text = turn.text[: turn.cut_after_chars] if failing else turn.text
        for start in range(0, len(text), turn.chunk_chars):
            await _pause(turn.delay_s)
            yield TextDelta(text[start : start + turn.chunk_chars])
        if failing:
            raise ModelError(
                f"scripted cut of turn {index + 1}, attempt {request.attempt}, after {len(text)} characters",
                kind="cut_stream",
                retry_after_ms=turn.retry_after_ms,
            )
        output_chars = len(turn.text)
        for position, (tool, arguments) in enumerate(turn.tool_calls, start=1):
            call_id = f"call_{index + 1}_{position}"
            arguments_text = arguments if isinstance(arguments, str) else json.dumps(arguments)
            output_chars += len(arguments_text)
            await _pause(turn.delay_s)
            yield ToolCallStart(call_id, tool)
            for start in range(0, len(arguments_text), turn.chunk_chars):
                await _pause(turn.delay_s)
                yield ToolCallDelta(call_id, arguments_text[start : start + turn.chunk_chars])
            yield ToolCallEnd(call_id)
        usage = turn.usage or Usage(
            input_tokens=count_tokens(transcript_chars(request)), output_tokens=count_tokens(output_chars)
        )
        yield UsageReport(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_tokens=usage.cached_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            cost=usage.cost,
        )
        yield Finish(turn.finish_reason or ("tool_calls" if turn.tool_calls else "stop"))


async def _checkpoint() -> None:
    await trio.lowlevel.checkpoint()


async def _pause(delay_s: float) -> None:
    if delay_s > 0:
        await trio.sleep(delay_s)
