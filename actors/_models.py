"""Models: a provider-neutral streaming interface, the assembled assistant turn, model errors and retry back-off.

A model turns a :class:`ModelRequest` (instructions, a normalised transcript and tool specs) into a stream of
events; :class:`TurnBuilder` folds the stream into one :class:`AssistantTurn`. Providers map their own wire formats
and errors onto these at one boundary (their adapter), so the run loop never sees a provider's types.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, ClassVar, Final, Literal, Protocol, TypeAlias, runtime_checkable

import attrs
import trio

import protocol
from protocol import TetherError, UsageError, check_json

from ._tools import ToolSpec

# ------------------------------------------------------------------------------------------------ transcript


@attrs.frozen(kw_only=True)
class ToolCallRequest:
    """A tool call the model asked for.

    ``arguments`` is the parsed JSON object when the model sent a valid one. When it did not, ``arguments`` is the
    text exactly as received and ``invalid_arguments`` says what is wrong with it; the run loop answers such a call
    with an error result the model sees, without running the tool.
    """

    call_id: str
    name: str
    arguments: dict[str, Any] | str
    invalid_arguments: str | None = None

    def __attrs_post_init__(self) -> None:
        if isinstance(self.arguments, str) != (self.invalid_arguments is not None):
            raise UsageError(
                f"tool call {self.call_id!r}: arguments are a dict when valid, and the received text together with "
                "invalid_arguments when not"
            )


@attrs.frozen(kw_only=True)
class UserMessage:
    role: ClassVar[Literal["user"]] = "user"
    text: str


@attrs.frozen(kw_only=True)
class AssistantMessage:
    role: ClassVar[Literal["assistant"]] = "assistant"
    text: str = ""
    tool_calls: tuple[ToolCallRequest, ...] = ()


@attrs.frozen(kw_only=True)
class ToolMessage:
    """The result of the tool call ``call_id``, as text the model reads; ``is_error`` marks a failed call."""

    role: ClassVar[Literal["tool"]] = "tool"
    call_id: str
    content: str
    is_error: bool = False


Message: TypeAlias = UserMessage | AssistantMessage | ToolMessage
"""One record of the normalised transcript a model reads; ``message.role`` tells which."""


@attrs.frozen(kw_only=True)
class ModelRequest:
    """One request to a model: ``attempt`` is 1 for the first try and grows with each retry of the same turn."""

    model: str
    instructions: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    attempt: int = 1

    def __attrs_post_init__(self) -> None:
        if type(self.attempt) is not int or self.attempt < 1:
            raise UsageError(f"a model request's attempt counts from 1, not {self.attempt!r}")


# ------------------------------------------------------------------------------------------------ stream events

FinishReason: TypeAlias = str
"""``stop``, ``tool_calls``, ``length``, ``content_filter``, or another string a provider gave (kept as is)."""


@attrs.frozen
class TextDelta:
    text: str


@attrs.frozen
class ToolCallStart:
    call_id: str
    name: str


@attrs.frozen
class ToolCallDelta:
    """A fragment of the call's arguments as JSON text; the fragments of a call joined are the whole text."""

    call_id: str
    fragment: str


@attrs.frozen
class ToolCallEnd:
    call_id: str


@attrs.frozen(kw_only=True)
class Usage:
    """Tokens of one model response. ``cached_tokens`` are part of ``input_tokens``, ``reasoning_tokens`` of
    ``output_tokens``, as providers count them."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float | None = None
    """What the provider says the response cost (OpenRouter's ``usage.cost``), if it says; the owner's price table,
    when it prices the model, wins."""


@attrs.frozen(kw_only=True)
class UsageReport:
    """The response's token counts so far; the last report of a stream is its usage (an adapter whose provider
    reports pieces adds them up before reporting). ``cost``: as the provider reports it, if it does."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float | None = None


@attrs.frozen
class Finish:
    reason: FinishReason


StreamEvent: TypeAlias = TextDelta | ToolCallStart | ToolCallDelta | ToolCallEnd | UsageReport | Finish


# ------------------------------------------------------------------------------------------------ errors

RETRYABLE_KINDS: Final = frozenset({"rate_limit", "overloaded", "server_error", "connection", "timeout", "cut_stream"})
"""Failures that a later attempt may not meet. Every other kind (``bad_request``, ``authentication``,
``context_overflow``, ``invalid_stream``, ``script_exhausted``, or one a provider adapter names) is final."""


class ModelError(TetherError):
    """A model request failed: ``kind`` says how, ``retryable`` whether another attempt may succeed (by default
    from the kind, see :data:`RETRYABLE_KINDS`), ``retry_after_ms`` how long the provider asked us to wait."""

    def __init__(
        self, message: str, *, kind: str, retryable: bool | None = None, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = kind in RETRYABLE_KINDS if retryable is None else retryable
        self.retry_after_ms = retry_after_ms

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild_model_error, (str(self), self.kind, self.retryable, self.retry_after_ms)


def _rebuild_model_error(message: str, kind: str, retryable: bool, retry_after_ms: int | None) -> ModelError:
    return ModelError(message, kind=kind, retryable=retryable, retry_after_ms=retry_after_ms)


# ------------------------------------------------------------------------------------------------ the model


@runtime_checkable
class Model(Protocol):
    """A model: ``stream(request)`` is an async generator of :data:`StreamEvent`; it fails by raising
    :class:`ModelError` (before or after some events)."""

    @property
    def name(self) -> str: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]: ...


# ------------------------------------------------------------------------------------------------ assembling


@attrs.frozen(kw_only=True)
class AssistantTurn:
    """A model's whole answer to one request: the assistant message, its usage (``None`` when the model reported
    none: unknown, not zero) and why it finished."""

    message: AssistantMessage
    usage: Usage | None
    finish_reason: FinishReason

    @property
    def text(self) -> str:
        return self.message.text

    @property
    def tool_calls(self) -> tuple[ToolCallRequest, ...]:
        return self.message.tool_calls


class TurnBuilder:
    """Folds a stream's events, as they come, into an :class:`AssistantTurn`.

    A stream that breaks the event grammar (a delta for a call that never started, an event after ``Finish``, a
    ``Finish`` with a call still open) raises a final :class:`ModelError` of kind ``invalid_stream``: that is an
    adapter's bug. A stream that ends without ``Finish`` is cut: :meth:`result` raises a retryable ``cut_stream``.
    """

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[str, tuple[str, list[str]]] = {}  # call_id -> (name, fragments), in start order
        self._open: set[str] = set()
        self._usage: Usage | None = None
        self._finish: FinishReason | None = None

    @property
    def text(self) -> str:
        """The text so far (for showing partial output)."""
        return "".join(self._text)

    def feed(self, event: StreamEvent) -> None:
        if self._finish is not None:
            raise _invalid(f"{event!r} came after the stream finished")
        match event:
            case TextDelta(text=text):
                self._text.append(text)
            case ToolCallStart(call_id=call_id, name=name):
                if call_id in self._calls:
                    raise _invalid(f"tool call {call_id!r} started twice")
                self._calls[call_id] = (name, [])
                self._open.add(call_id)
            case ToolCallDelta(call_id=call_id, fragment=fragment):
                if call_id not in self._open:
                    raise _invalid(f"arguments for tool call {call_id!r}, which is not open")
                self._calls[call_id][1].append(fragment)
            case ToolCallEnd(call_id=call_id):
                if call_id not in self._open:
                    raise _invalid(f"end of tool call {call_id!r}, which is not open")
                self._open.discard(call_id)
            case UsageReport():
                self._usage = Usage(
                    input_tokens=event.input_tokens,
                    output_tokens=event.output_tokens,
                    cached_tokens=event.cached_tokens,
                    reasoning_tokens=event.reasoning_tokens,
                    cost=event.cost,
                )
            case Finish(reason=reason):
                if self._open:
                    raise _invalid(f"the stream finished with tool calls still open: {sorted(self._open)}")
                self._finish = reason
            case _:
                raise _invalid(f"{event!r} is not a stream event")

    def result(self) -> AssistantTurn:
        """The assembled turn; tool-call arguments are parsed here, once the stream is whole."""
        if self._finish is None:
            raise ModelError(
                "the model's stream ended before it said it finished; the partial answer is not used, and the "
                "request may be sent again",
                kind="cut_stream",
            )
        calls = tuple(
            _parse_call(call_id, name, "".join(fragments)) for call_id, (name, fragments) in self._calls.items()
        )
        return AssistantTurn(
            message=AssistantMessage(text=self.text, tool_calls=calls), usage=self._usage, finish_reason=self._finish
        )


def assemble(events: Iterable[StreamEvent]) -> AssistantTurn:
    """The :class:`AssistantTurn` of a whole stream's events (see :class:`TurnBuilder`)."""
    builder = TurnBuilder()
    for event in events:
        builder.feed(event)
    return builder.result()


def _invalid(what: str) -> ModelError:
    return ModelError(f"the model adapter sent a malformed stream: {what}", kind="invalid_stream")


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _parse_call(call_id: str, name: str, text: str) -> ToolCallRequest:
    if not text.strip():
        return ToolCallRequest(call_id=call_id, name=name, arguments={})  # some providers send nothing for no args
    try:
        arguments = json.loads(text, parse_constant=_no_constants)
        check_json(arguments, "$")
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        return ToolCallRequest(
            call_id=call_id, name=name, arguments=text, invalid_arguments=f"the arguments are not valid JSON: {exc}"
        )
    if not isinstance(arguments, dict):
        return ToolCallRequest(
            call_id=call_id,
            name=name,
            arguments=text,
            invalid_arguments=f"the arguments must be a JSON object, not a {_json_type(arguments)}",
        )
    return ToolCallRequest(call_id=call_id, name=name, arguments=arguments)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array"


# ------------------------------------------------------------------------------------------------ retry


def _at_least(minimum: float) -> Any:
    def check(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= minimum:
            raise UsageError(f"Retry.{attribute.name} must be a number of {minimum} or more, not {value!r}")

    return check


@attrs.frozen(kw_only=True)
class Retry:
    """How a model request that failed with a retryable error is tried again: at most ``attempts`` attempts in
    all, waiting ``first_delay_ms`` after the first failure and ``multiplier`` times longer after each next one, at
    most ``max_delay_ms``.

    Deterministic, without jitter: the delay becomes a durable deadline on the owner's clock, and tests and replays
    must see the same one. (A jitter derived from the operation id could be added without losing that.)
    """

    attempts: int = attrs.field(default=4, validator=_at_least(1))
    first_delay_ms: int = attrs.field(default=500, validator=_at_least(0))
    max_delay_ms: int = attrs.field(default=30_000, validator=_at_least(0))
    multiplier: float = attrs.field(default=2.0, validator=_at_least(1.0))

    def __attrs_post_init__(self) -> None:
        for name in ("attempts", "first_delay_ms", "max_delay_ms"):
            if type(getattr(self, name)) is not int:
                raise UsageError(f"Retry.{name} must be a whole number, not {getattr(self, name)!r}")
        if not math.isfinite(self.multiplier):
            raise UsageError(f"Retry.multiplier must be finite, not {self.multiplier!r}")
        if self.max_delay_ms < self.first_delay_ms:
            raise UsageError(
                f"Retry.max_delay_ms ({self.max_delay_ms}) is below first_delay_ms ({self.first_delay_ms})"
            )

    def delay_ms(self, attempt: int, retry_after_ms: int | None = None) -> int | None:
        """How long to wait after attempt ``attempt`` (1-based) failed before the next one, or ``None`` when that
        was the last attempt. A provider's ``retry_after_ms`` is a floor, capped at ``max_delay_ms`` like the rest.
        The delay is :func:`protocol.retry_delay_ms`, the one formula the owner uses too (see :func:`backoff_ms`).
        """
        if type(attempt) is not int or attempt < 1:
            raise UsageError(f"attempts count from 1, not {attempt!r}")
        if retry_after_ms is not None and retry_after_ms < 0:
            raise UsageError(f"retry_after_ms cannot be negative ({retry_after_ms})")
        return next_delay_ms(self.to_protocol(), attempt, retry_after_ms)

    def to_protocol(self) -> protocol.Retry:
        """The policy as a model request's intent stores it (:class:`protocol.Retry`, the same fields)."""
        return protocol.Retry(
            attempts=self.attempts,
            first_delay_ms=self.first_delay_ms,
            max_delay_ms=self.max_delay_ms,
            multiplier=self.multiplier,
        )


def backoff_ms(retry: protocol.Retry, attempt: int, retry_after_ms: int | None = None) -> int:
    """The delay after failed attempt ``attempt``: :func:`protocol.retry_delay_ms` (shared with the owner, which
    computes the same deadline for an interrupted request), with a provider's ``retry_after_ms`` as a floor, capped
    at ``max_delay_ms``."""
    try:
        delay = protocol.retry_delay_ms(retry, attempt)
    except OverflowError:
        delay = retry.max_delay_ms
    if retry_after_ms is not None:
        delay = max(delay, min(retry_after_ms, retry.max_delay_ms))
    return delay


def next_delay_ms(retry: protocol.Retry, attempt: int, retry_after_ms: int | None = None) -> int | None:
    """How long to wait after failed attempt ``attempt`` before the next one (:func:`backoff_ms`), or ``None`` when
    ``attempt`` was the policy's last: then nothing is retried, and the failure is final. The one place that knows
    the last attempt, for :meth:`Retry.delay_ms` and the run loop (which holds the policy the journal stored)."""
    if attempt >= retry.attempts:
        return None
    return backoff_ms(retry, attempt, retry_after_ms)


DEFAULT_RETRY: Final = Retry()


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


# ------------------------------------------------------------------------------------------------ scripted model

DEFAULT_CHUNK_CHARS: Final = 8


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

    Turn ``i`` answers the ``i``-th model request of a run, and ``i`` is read from the request itself (the assistant
    messages after the last user message, see :func:`turn_index`), so a request answers the same after any restart
    and every run of a conversation replays the script from its first turn. Call ids are ``call_<turn>_<position>``
    (from 1). A request past the last turn fails with a final ``script_exhausted`` error.
    """

    turns: tuple[ScriptedTurn, ...] = attrs.field(converter=_turns)
    name: str = attrs.field(default="scripted", kw_only=True)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        index = turn_index(request.messages)
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
