"""The Chat Completions API as ``actors.OpenAIChat`` speaks it, sans-IO (h11-like, fed bytes or chunks, tested
without a network): what a request's messages are, what a response's event stream carries, and what an error says.

- :class:`SSEParser` turns the response body's bytes, however they were split by the network, into server-sent
  events, with a bound on a line. (httpx-sse opens the request; its own line decoder buffers an unterminated line
  without a limit and drops a last event that has no blank line after it, so the body is decoded here.)
- :class:`ChatStreamDecoder` turns the decoded chunks into the provider-neutral stream events, tolerating what real
  servers send (tool-call deltas without ``index`` or ``id``, parallel calls that reuse index 0, the usage chunk with
  ``choices: []`` or usage on the last choice chunk, a missing ``[DONE]``).
- :class:`ServerError` and :func:`classify_error` read what a server said about a failure and give its
  :class:`~actors.ModelError` kind; :func:`parse_retry_after` how long it asked us to wait.
- :func:`request_messages`: a request's transcript as Chat Completions messages.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from ._model import (
    AssistantMessage,
    Finish,
    ModelError,
    ModelRequest,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolMessage,
    UsageReport,
    UserMessage,
)

MAX_LINE_BYTES: Final = 4 * 1024 * 1024
"""The longest line of the event stream (one chunk's JSON is one line)."""
MAX_TOOL_CALLS: Final = 256
"""The most tool calls one response may open."""
MAX_RETRY_AFTER_MS: Final = 24 * 60 * 60 * 1000
"""A server's ``Retry-After`` above this is taken as this (the retry policy caps it further)."""

_CONTEXT_OVERFLOW: Final = re.compile(
    r"context[ _]length|context window|context size|maximum context|prompt is too long|input is too long"
    r"|too many tokens|reduce the length of the messages|maximum prompt length|exceeds the available context",
    re.IGNORECASE,
)
"""How servers say a request does not fit the model's context (OpenAI, vLLM, llama.cpp, Ollama, LiteLLM, ...)."""

_CODE_KINDS: Final[Mapping[str, str]] = {
    "context_length_exceeded": "context_overflow",
    "exceed_context_size_error": "context_overflow",
    "contextwindowexceedederror": "context_overflow",
    "insufficient_quota": "quota_exceeded",
    "rate_limit_exceeded": "rate_limit",
    "rate_limit_error": "rate_limit",
    "ratelimiterror": "rate_limit",
    "too_many_requests": "rate_limit",
    "server_error": "server_error",
    "internal_error": "server_error",
    "internal_server_error": "server_error",
    "internalservererror": "server_error",
    "api_error": "server_error",
    "apierror": "server_error",
    "overloaded": "overloaded",
    "overloaded_error": "overloaded",
    "service_unavailable": "overloaded",
    "serviceunavailableerror": "overloaded",
    "invalid_request_error": "bad_request",
    "invalid_request": "bad_request",
    "bad_request": "bad_request",
    "badrequesterror": "bad_request",
    "authentication_error": "authentication",
    "authenticationerror": "authentication",
    "invalid_api_key": "authentication",
    "unauthorized": "authentication",
    "permission_error": "permission_denied",
    "permission_denied": "permission_denied",
    "permissiondeniederror": "permission_denied",
    "not_found_error": "not_found",
    "notfounderror": "not_found",
    "model_not_found": "not_found",
    "timeout": "timeout",
    "timeout_error": "timeout",
}
"""Error ``code`` / ``type`` strings (lowercased) as OpenAI, vLLM, LiteLLM and others name them, to their kind."""

_RETRYABLE_OVERRIDES: Final[Mapping[str, bool]] = {"conflict": True, "invalid_response": True}
"""Kinds named here that :data:`~actors._models._model.RETRYABLE_KINDS` does not list: a conflict (HTTP 409) and a
response that could not be read (a garbled chunk, a call without a name) may not happen again."""


# ------------------------------------------------------------------------------------------------ errors


@attrs.frozen(kw_only=True)
class ServerError:
    """What a server said about a failure: its message, ``code`` and ``type`` (any may be missing)."""

    message: str = ""
    code: str | int | None = None
    type: str | None = None

    @classmethod
    def from_payload(cls, payload: object) -> ServerError:
        """From a JSON error body: ``{"error": {...}}`` (OpenAI), ``{"error": "text"}`` (Ollama), a top-level
        ``{"object": "error", "message", "code"}`` (vLLM), ``{"detail": ...}`` (FastAPI), or anything else."""
        if not isinstance(payload, dict):
            return cls(message=_text(payload))
        error = payload.get("error")
        if isinstance(error, dict):
            payload = error
        elif error is not None:
            return cls(message=_text(error))
        message = payload.get("message")
        if message is None:
            message = payload.get("detail")
        code = payload.get("code")
        kind = payload.get("type")
        return cls(
            message=_text(message) if message is not None else "",
            code=code if isinstance(code, str | int) and not isinstance(code, bool) else None,
            type=kind if isinstance(kind, str) else None,
        )

    @classmethod
    def from_body(cls, body: bytes) -> ServerError:
        text = body.decode("utf-8", errors="replace").strip()
        try:
            return cls.from_payload(json.loads(text))
        except ValueError:
            return cls(message=text)


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def classify_error(status: int | None, error: ServerError) -> tuple[str, bool | None]:
    """The :class:`~actors.ModelError` kind of a failure, and its ``retryable`` when the kind's default does not
    hold (else ``None``). ``status`` is the HTTP status, or ``None`` for an error object in the middle of a stream
    (then a numeric ``code`` counts as the status, and a code nobody names is a server error: retryable)."""
    if status is None and isinstance(error.code, int):
        status = error.code
    if status is None and isinstance(error.code, str) and error.code.isdigit():
        status = int(error.code)
    named = [_CODE_KINDS.get(str(value).lower()) for value in (error.code, error.type) if value is not None]
    named_kind = next((kind for kind in named if kind is not None), None)
    if status is not None and 200 <= status < 300:
        status = None  # an error object in a 200 response: the code names it
    if status is None:
        if named_kind is not None:
            kind = named_kind
        else:
            kind = "context_overflow" if _CONTEXT_OVERFLOW.search(error.message) else "server_error"
    elif status == 429:
        kind = "quota_exceeded" if named_kind == "quota_exceeded" else "rate_limit"
    elif status == 408:
        kind = "timeout"
    elif status == 409:
        kind = "conflict"
    elif status in (503, 529):
        kind = "overloaded"
    elif status >= 500:
        kind = "server_error"
    elif named_kind == "context_overflow" or _CONTEXT_OVERFLOW.search(error.message):
        kind = "context_overflow"
    elif status == 401:
        kind = "authentication"
    elif status == 403:
        kind = "permission_denied"
    elif status == 404:
        kind = "not_found"
    else:
        kind = "bad_request"  # 400, 413, 422 and every other 4xx: the same request fails the same way
    return kind, _RETRYABLE_OVERRIDES.get(kind)


def parse_retry_after(headers: Mapping[str, str], now_s: float) -> int | None:
    """How long a server asked us to wait, in ms: ``retry-after-ms`` (milliseconds), else ``Retry-After`` (seconds,
    or an HTTP date, counted from ``now_s`` on the wall clock); ``None`` when absent or unreadable; at most
    :data:`MAX_RETRY_AFTER_MS`."""
    for name, scale in (("retry-after-ms", 1.0), ("retry-after", 1000.0)):
        value = headers.get(name)
        if value is None:
            continue
        value = value.strip()
        try:
            delay_ms = float(value) * scale
        except ValueError:
            if scale == 1.0:
                continue
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError, IndexError):
                continue
            delay_ms = (when.timestamp() - now_s) * 1000.0
        if math.isfinite(delay_ms):
            return min(MAX_RETRY_AFTER_MS, max(0, math.ceil(delay_ms)))
    return None


# ------------------------------------------------------------------------------------------------ the event stream


class SSEParser:
    """Server-sent events from a body's bytes, fed in pieces as the network delivers them (sans-IO).

    ``feed(data)`` returns the ``(event, data)`` pairs that the bytes completed; ``close()`` those still pending at
    the end of the body (a last event without its blank line counts). Comment lines (``: ping``) and fields other
    than ``event`` and ``data`` are skipped; lines end with ``\\n`` or ``\\r\\n``. A line longer than
    :data:`MAX_LINE_BYTES` raises :class:`ValueError`.
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        self._event = ""
        self._data: list[str] = []

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        scanned = len(self._buffer)  # holds no newline: a long line fed in small pieces is scanned once
        self._buffer += data
        events: list[tuple[str, str]] = []
        start = 0
        while (end := self._buffer.find(b"\n", max(start, scanned))) >= 0:
            self._line(bytes(self._buffer[start:end]).rstrip(b"\r"), events)
            start = end + 1
        del self._buffer[:start]
        if len(self._buffer) > self._max_line_bytes:
            raise ValueError(f"a line of the event stream is longer than {self._max_line_bytes} bytes")
        return events

    def close(self) -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []
        if self._buffer:
            self._line(bytes(self._buffer).rstrip(b"\r"), events)
            self._buffer.clear()
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[tuple[str, str]]) -> None:
        if not raw:
            if self._data:
                events.append((self._event, "\n".join(self._data)))
            self._event, self._data = "", []
            return
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value


@attrs.define(eq=False)
class _Call:
    call_id: str
    index: int | None
    named_by_server: bool
    name: str | None = None
    started: bool = False
    pending: list[str] = attrs.Factory(list)


class ChatStreamDecoder:
    """The neutral stream events of one streamed Chat Completions response, fed its chunks (sans-IO).

    ``feed(chunk)`` takes one decoded ``chat.completion.chunk`` and returns the events it completes: text deltas at
    once, a tool call's start once its name is known, then its argument fragments. ``end()`` closes the stream:
    every open call ends, then the usage (when the server reported any: the last report wins) and the finish reason.
    A stream that ended without a ``finish_reason`` is cut: ``end()`` raises a retryable ``cut_stream``.

    Tool-call deltas are matched to calls in this order: a known ``id`` continues its call; a new ``id`` opens a new
    call (even at an index in use: Ollama sends parallel calls all at index 0), unless the call at that index got no
    ``id`` from the server (an ``id`` that comes after the call's first delta); without an ``id``, the ``index``
    names the call; with neither, a delta that brings a name opens a new call and one without continues the last.
    A call without an ``id`` gets ``call_<n>`` (its position in the response).
    """

    def __init__(self, where: str = "the model") -> None:
        self._where = where
        self._calls: list[_Call] = []
        self._by_id: dict[str, _Call] = {}
        self._by_index: dict[int, _Call] = {}
        self._finish: str | None = None
        self._usage: UsageReport | None = None
        self.chunks = 0

    @property
    def finished(self) -> bool:
        """Whether the server said why it finished (what is left to come is at most the usage)."""
        return self._finish is not None

    def feed(self, chunk: Mapping[str, Any]) -> list[StreamEvent]:
        self.chunks += 1
        events: list[StreamEvent] = []
        usage = _usage(chunk.get("usage"))
        if usage is not None:
            self._usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return events
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) not in (0, None):
                continue  # only the first choice is asked for (n = 1)
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta, events)
            usage = _usage(choice.get("usage"))  # some servers put it on the choice
            if usage is not None:
                self._usage = usage
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self._finish = reason
        return events

    def _delta(self, delta: Mapping[str, Any], events: list[StreamEvent]) -> None:
        for field in ("content", "refusal"):
            text = delta.get(field)
            if isinstance(text, str) and text:
                events.append(TextDelta(text))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call_delta in calls:
                if isinstance(call_delta, dict):
                    self._call_delta(call_delta, events)

    def _call_delta(self, delta: Mapping[str, Any], events: list[StreamEvent]) -> None:
        raw_id, raw_index, function = delta.get("id"), delta.get("index"), delta.get("function")
        if not isinstance(function, dict):
            function = {}
        raw_name, arguments = function.get("name"), function.get("arguments")
        call_id = raw_id if isinstance(raw_id, str) and raw_id else None
        index = raw_index if type(raw_index) is int else None
        name = raw_name if isinstance(raw_name, str) and raw_name else None
        if arguments is not None and not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)  # a server that sends the object itself
        last = self._calls[-1] if self._calls else None
        call: _Call | None
        if call_id is not None:
            call = self._by_id.get(call_id)
            at_index = self._by_index.get(index) if index is not None else None
            if call is None and at_index is not None and not at_index.named_by_server:
                call = at_index  # the id came after the call's first delta: the call keeps the id it was given
        elif index is not None:
            call = self._by_index.get(index)
        elif last is not None and not (name is not None and last.name is not None):
            call = last
        else:
            call = None
        if call is None:
            call = self._open(call_id, index)
        elif index is not None and call.index is None:
            call.index = index
            self._by_index[index] = call
        if call.name is None and name is not None:
            call.name = name
        if arguments:
            call.pending.append(arguments)
        if not call.started and call.name is not None:
            call.started = True
            events.append(ToolCallStart(call.call_id, call.name))
        if call.started:
            events.extend(ToolCallDelta(call.call_id, fragment) for fragment in call.pending)
            call.pending.clear()

    def _open(self, call_id: str | None, index: int | None) -> _Call:
        if len(self._calls) >= MAX_TOOL_CALLS:
            raise ModelError(
                f"{self._where} opened more than {MAX_TOOL_CALLS} tool calls in one response; the response is not used",
                kind="response_too_large",
            )
        named_by_server = call_id is not None
        if call_id is None:
            position = len(self._calls) + 1
            call_id = f"call_{position}"
            while call_id in self._by_id:
                call_id += "_"
        call = _Call(call_id=call_id, index=index, named_by_server=named_by_server)
        self._calls.append(call)
        self._by_id[call_id] = call
        if index is not None:
            self._by_index[index] = call  # a new call at an index in use takes the index over
        return call

    def end(self) -> list[StreamEvent]:
        if self._finish is None:
            raise ModelError(
                f"the stream from {self._where} ended before it said it finished (after {self.chunks} chunks); the "
                "partial answer is not used, and the request may be sent again",
                kind="cut_stream",
            )
        unnamed = [call.call_id for call in self._calls if call.name is None]
        if unnamed:
            raise ModelError(
                f"{self._where} sent tool call(s) {unnamed} without a function name; the response is not used",
                kind="invalid_response",
                retryable=True,
            )
        events: list[StreamEvent] = [ToolCallEnd(call.call_id) for call in self._calls]
        if self._usage is not None:
            events.append(self._usage)
        events.append(Finish(self._finish))
        return events


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _usage(value: object) -> UsageReport | None:
    """A ``usage`` object as a report, or ``None`` when it is absent or lacks the two counts."""
    if not isinstance(value, dict):
        return None
    input_tokens, output_tokens = _count(value.get("prompt_tokens")), _count(value.get("completion_tokens"))
    if input_tokens is None or output_tokens is None:
        return None
    prompt = value.get("prompt_tokens_details")
    completion = value.get("completion_tokens_details")
    cached = _count(prompt.get("cached_tokens")) if isinstance(prompt, dict) else None
    if cached is None:
        cached = _count(value.get("prompt_cache_hit_tokens"))  # DeepSeek's name for it
    reasoning = _count(completion.get("reasoning_tokens")) if isinstance(completion, dict) else None
    reported = value.get("cost")  # OpenRouter's: what the request cost, in its credits
    cost = float(reported) if isinstance(reported, int | float) and not isinstance(reported, bool) else None
    return UsageReport(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_tokens=cached or 0,
        reasoning_tokens=reasoning or 0,
        cost=cost if cost is not None and math.isfinite(cost) and cost >= 0 else None,
    )


# ------------------------------------------------------------------------------------------------ the request


def request_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The request's transcript as Chat Completions messages: the instructions as the system message, then user,
    assistant (with ``tool_calls``) and tool (with ``tool_call_id``) messages. A call's arguments go as the JSON
    text of the object, or as the text the model sent when that was not a JSON object."""
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    for message in request.messages:
        if isinstance(message, UserMessage):
            messages.append({"role": "user", "content": message.text})
        elif isinstance(message, AssistantMessage):
            entry: dict[str, Any] = {"role": "assistant", "content": message.text or None}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": call.arguments
                            if isinstance(call.arguments, str)
                            else json.dumps(call.arguments, ensure_ascii=False),
                        },
                    }
                    for call in message.tool_calls
                ]
            elif not message.text:
                entry["content"] = ""
            messages.append(entry)
        elif isinstance(message, ToolMessage):
            messages.append({"role": "tool", "tool_call_id": message.call_id, "content": message.content})
    return messages
