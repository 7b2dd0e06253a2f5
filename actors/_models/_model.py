"""Models: a provider-neutral streaming interface, the assembled assistant turn and model errors.

A model turns a :class:`ModelRequest` (instructions, a normalised transcript and tool specs) into a stream of
events; :class:`TurnBuilder` folds the stream into one :class:`AssistantTurn`. Providers map their own wire formats
and errors onto these at one boundary (their adapter), so the run loop never sees a provider's types.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, ClassVar, Final, Literal, Protocol, TypeAlias, runtime_checkable

import attrs

from protocol import TetherError, UsageError, check_json

# ------------------------------------------------------------------------------------------------ transcript


@attrs.frozen(kw_only=True)
class ToolSpec:
    """The provider-neutral description of a tool that a model receives."""

    name: str
    description: str
    parameters: Mapping[str, Any]


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
    turn: int | None = None
    """Which model request of its run this is (1 for the first), as the run loop counts them; ``None`` for a
    request made outside a run."""
    output_schema: Mapping[str, Any] | None = None
    """The JSON Schema a final answer (one without tool calls) is asked to follow (its agent's ``output_schema``):
    an OpenAI-compatible server gets it as ``response_format``."""

    def __attrs_post_init__(self) -> None:
        if type(self.attempt) is not int or self.attempt < 1:
            raise UsageError(f"a model request's attempt counts from 1, not {self.attempt!r}")
        if self.turn is not None and (type(self.turn) is not int or self.turn < 1):
            raise UsageError(f"a model request's turn counts from 1, not {self.turn!r}")


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

    @property
    def usage(self) -> Usage | None:
        """The usage the stream reported so far, if it did (a failed attempt's is counted too)."""
        return self._usage

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
