"""``actors.OpenAIChat``: a model that speaks the Chat Completions API with streaming, over httpx and httpx-sse.

It serves OpenAI and the OpenAI-compatible servers people run (vLLM, llama.cpp's server, Ollama, LiteLLM,
OpenRouter). No vendor SDK: its retries would stack on Tether's durable ones; here every failure becomes one
:class:`~actors.ModelError` with a kind (retryable or final) and the run loop decides, durably, what happens next.

Three parts, the first two sans-IO (h11-like, fed bytes or chunks, tested without a network):

- :class:`SSEParser` turns the response body's bytes, however they were split by the network, into server-sent
  events, with a bound on a line. (httpx-sse opens the request; its own line decoder buffers an unterminated line
  without a limit and drops a last event that has no blank line after it, so the body is decoded here.)
- :class:`ChatStreamDecoder` turns the decoded chunks into the provider-neutral stream events, tolerating what real
  servers send (tool-call deltas without ``index`` or ``id``, parallel calls that reuse index 0, the usage chunk with
  ``choices: []`` or usage on the last choice chunk, a missing ``[DONE]``).
- :class:`OpenAIChat` does the HTTP, and maps every httpx error and every error response or error object in the
  stream to a :class:`~actors.ModelError` at that one boundary (:func:`classify_error`).
"""

from __future__ import annotations

import email.utils
import json
import math
import os
import re
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import attrs
import httpx
from httpx_sse import aconnect_sse

from protocol import UsageError, check_json

from ._models import (
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

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"
API_KEY_ENV: Final = "OPENAI_API_KEY"
BASE_URL_ENV: Final = "OPENAI_BASE_URL"
DEFAULT_TIMEOUT_S: Final = 600.0
"""The longest the server may stay silent (between two reads of the stream, or before it answers)."""
CONNECT_TIMEOUT_S: Final = 10.0
"""Connecting takes at most this (or ``timeout_s`` when that is shorter)."""
MAX_RESPONSE_BYTES: Final = 32 * 1024 * 1024
"""The most a response body may carry (decoded); past it the request fails, final ``response_too_large``."""
MAX_LINE_BYTES: Final = 4 * 1024 * 1024
"""The longest line of the event stream (one chunk's JSON is one line)."""
MAX_TOOL_CALLS: Final = 256
"""The most tool calls one response may open."""
MAX_ERROR_BODY_BYTES: Final = 64 * 1024
"""How much of an error response's body is read to find the server's message."""
MAX_ERROR_MESSAGE_CHARS: Final = 1000
"""How much of the server's message an error's text quotes."""
MAX_RETRY_AFTER_MS: Final = 24 * 60 * 60 * 1000
"""A server's ``Retry-After`` above this is taken as this (the retry policy caps it further)."""
RESERVED_BODY_KEYS: Final = frozenset({"model", "messages", "stream", "tools"})
"""Request fields the adapter writes itself; ``extra_body`` may not replace them."""
USER_AGENT: Final = "tether (actors.OpenAIChat)"

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
"""Kinds named here that :data:`~actors._models.RETRYABLE_KINDS` does not list: a conflict (HTTP 409) and a response
that could not be read (a garbled chunk, a call without a name) may not happen again."""


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


def _checked_base_url(base: object, source: str) -> str:
    """``base`` once it is an http(s) URL that httpx can send a request to: what httpx would only refuse at the first
    request (a character it rejects, a host name no resolver takes) is a :class:`UsageError` when the model is
    built, naming ``source`` (``base_url`` or the environment variable it came from)."""
    must = f"OpenAIChat: {source} must be an http:// or https:// URL such as {DEFAULT_BASE_URL!r}"
    if not isinstance(base, str):
        raise UsageError(must)
    try:
        parts = urlsplit(base)
        url = httpx.URL(base)
    except (ValueError, httpx.InvalidURL) as exc:
        raise UsageError(f"OpenAIChat: {source} is not a URL: {exc} ({base!r})") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(must)
    try:
        url.host.encode("idna")
    except UnicodeError as exc:
        raise UsageError(f"OpenAIChat: {source}'s host {url.host!r} is not a host name: {exc}") from None
    return base


def _checked_headers(headers: object) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in headers.items()
    ):
        raise UsageError("OpenAIChat: headers must map header names to string values")
    return dict(headers)


def _checked_extra_body(extra_body: object) -> dict[str, Any]:
    if extra_body is None:
        return {}
    if not isinstance(extra_body, Mapping):
        raise UsageError(f"OpenAIChat: extra_body must be a mapping of request fields, not {type(extra_body).__name__}")
    body = dict(extra_body)
    try:
        check_json(body, "extra_body")
    except ValueError as exc:
        raise UsageError(f"OpenAIChat: extra_body is not JSON-like: {exc}") from None
    reserved = sorted(RESERVED_BODY_KEYS & body.keys())
    if reserved:
        raise UsageError(
            f"OpenAIChat: extra_body may not set {', '.join(reserved)}: the adapter writes them from the request "
            "(the model name is OpenAIChat's first argument)"
        )
    if "stream_options" in body and not isinstance(body["stream_options"], dict):
        raise UsageError("OpenAIChat: extra_body's stream_options must be an object")
    return body


class OpenAIChat:
    """A model served over the Chat Completions API with streaming (OpenAI or any OpenAI-compatible server).

    ``model`` is the server's model name (it is also this model's ``name``, which the journal records).
    ``base_url`` means what it means for OpenAI's clients: requests go to ``{base_url}/chat/completions``; without
    it, ``OPENAI_BASE_URL``, else ``https://api.openai.com/v1``. ``api_key``: without it, ``OPENAI_API_KEY``; with
    neither (or ``""``) no ``Authorization`` header is sent, as a local server wants. ``timeout_s`` is the longest
    the server may stay silent (connecting: at most 10 s). ``extra_body`` adds fields to every request
    (``temperature``, ``max_tokens``, a server's own options; ``stream_options`` is merged) and ``headers`` adds
    headers.

    Each request uses its own ``httpx.AsyncClient`` (a connection per request, closed with it: a worker has no hook
    to close a model, and a client is bound to the trio run that made it); the TLS context is built once.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        extra_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise UsageError(f"OpenAIChat: model must be a model name such as 'gpt-4o-mini', not {model!r}")
        base = base_url if base_url is not None else os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
        base = _checked_base_url(base, "base_url" if base_url is not None else BASE_URL_ENV)
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")
        if not isinstance(key, str):
            raise UsageError("OpenAIChat: api_key must be a string")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s < math.inf:
            raise UsageError(f"OpenAIChat: timeout_s must be a positive number of seconds, not {timeout_s!r}")
        self._model = model
        self.base_url = base.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self._api_key = key.strip() or None
        self.timeout_s = float(timeout_s)
        self.extra_body = _checked_extra_body(extra_body)
        self.headers = _checked_headers(headers)
        self._ssl_context: ssl.SSLContext | None = None

    @property
    def name(self) -> str:
        return self._model

    def __repr__(self) -> str:  # never the key
        return f"OpenAIChat({self._model!r}, base_url={self.base_url!r})"

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body of the request for ``request``."""
        body: dict[str, Any] = {
            "model": self._model,
            "messages": request_messages(request),
            "stream": True,
            **self.extra_body,
            "stream_options": {"include_usage": True, **self.extra_body.get("stream_options", {})},
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": dict(tool.parameters),
                    },
                }
                for tool in request.tools
            ]
        return body

    def _request_headers(self) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        headers.update(self.headers)
        return headers

    def _client(self) -> httpx.AsyncClient:
        if self._ssl_context is None:
            # Built once: httpx builds one for every client otherwise (loading the CA bundle, even for http://).
            self._ssl_context = httpx.create_ssl_context()
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, CONNECT_TIMEOUT_S)),
            verify=self._ssl_context,
            follow_redirects=False,
        )

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        """The model's answer to ``request`` as neutral stream events (a checkpoint: it does network I/O).

        Raises :class:`~actors.ModelError`: retryable for HTTP 408, 409, 429 (with the server's ``Retry-After`` as
        ``retry_after_ms``), 5xx, a connection refused or reset, a timeout, a stream cut before it finished or a
        response that could not be read; final for 400, 401, 403, 404, 422 and other 4xx, a request past the
        model's context (``context_overflow``), an exhausted quota (429 ``insufficient_quota``), a response past the
        bounds, a URL httpx refuses (``bad_request``), a response this adapter misread (httpx's ``StreamError``:
        ``invalid_stream``). An error object in the stream is classified by its code like an HTTP error. No httpx
        error escapes unmapped: a run meets a classified model error, never a phase's crash."""
        decoder = ChatStreamDecoder(self._where())
        body = self.request_body(request)
        started = False
        async with self._client() as client:
            try:
                async with aconnect_sse(client, "POST", self.url, json=body, headers=self._request_headers()) as source:
                    response = source.response
                    if not 200 <= response.status_code < 300:
                        raise await self._status_error(response)
                    started = True
                    async for event in self._events(response, decoder):
                        yield event
            except httpx.StreamError as exc:  # a RuntimeError, not an HTTPError: this adapter misread a response
                raise self._misread(exc) from None
            except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL is not an HTTPError either
                if not decoder.finished:
                    raise self._transport_error(exc, started) from None
                # Lost after the server said it finished: the answer is whole; only the usage may be missing.
        for event in decoder.end():
            yield event

    async def _events(self, response: httpx.Response, decoder: ChatStreamDecoder) -> AsyncIterator[StreamEvent]:
        content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if content_type == "application/json":  # a server that ignored stream: true, or an error with status 200
            payload = self._json(await self._read(response, MAX_RESPONSE_BYTES, limit_error=True))
            if isinstance(payload, dict) and (payload.get("error") or payload.get("object") == "error"):
                raise self._stream_error(ServerError.from_payload(payload))
            for event in decoder.feed(_as_chunk(payload)):
                yield event
            return
        parser = SSEParser()
        received = 0
        async for data in response.aiter_bytes():
            received += len(data)
            if received > MAX_RESPONSE_BYTES:
                raise self._too_large()
            try:
                pairs = parser.feed(data)
            except ValueError as exc:
                raise self._too_large(str(exc)) from None
            for name, text in pairs:
                if text.strip() == "[DONE]":
                    return
                for event in self._chunk_events(decoder, name, text):
                    yield event
        for name, text in parser.close():
            if text.strip() == "[DONE]":
                return
            for event in self._chunk_events(decoder, name, text):
                yield event
        if decoder.chunks == 0 and content_type not in ("text/event-stream", ""):
            raise ModelError(
                f"{self._where()} answered with {content_type}, not an event stream (is the base URL that of an "
                "OpenAI-compatible API, usually ending in /v1?)",
                kind="invalid_response",
                retryable=False,
            )

    def _chunk_events(self, decoder: ChatStreamDecoder, name: str, text: str) -> list[StreamEvent]:
        if not text.strip():
            return []
        chunk = self._json(text)
        if name == "error" or (isinstance(chunk, dict) and (chunk.get("error") or chunk.get("object") == "error")):
            raise self._stream_error(ServerError.from_payload(chunk))
        if not isinstance(chunk, dict):
            raise ModelError(
                f"{self._where()} sent a stream chunk that is not a JSON object: {text[:200]!r}",
                kind="invalid_response",
                retryable=True,
            )
        return decoder.feed(chunk)

    def _json(self, data: bytes | str) -> Any:
        try:
            return json.loads(data)
        except ValueError:
            snippet = data[:200] if isinstance(data, str) else data[:200].decode("utf-8", errors="replace")
            raise ModelError(
                f"{self._where()} sent a response that is not JSON: {snippet!r}",
                kind="invalid_response",
                retryable=True,
            ) from None

    async def _read(self, response: httpx.Response, limit: int, *, limit_error: bool = False) -> bytes:
        body = bytearray()
        async for data in response.aiter_bytes():
            body += data
            if len(body) > limit:
                if limit_error:
                    raise self._too_large()
                break
        return bytes(body[:limit])

    async def _status_error(self, response: httpx.Response) -> ModelError:
        try:
            error = ServerError.from_body(await self._read(response, MAX_ERROR_BODY_BYTES))
        except httpx.HTTPError:
            error = ServerError()  # the status says enough
        kind, retryable = classify_error(response.status_code, error)
        retry_after = parse_retry_after(response.headers, time.time())
        status = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
        hint = ""
        if kind == "authentication" and self._api_key is None:
            hint = f" (no API key was sent: set {API_KEY_ENV} or pass api_key=)"
        return ModelError(
            self._redact(f"{self._where()} answered {status}{_describe(error)}{hint}"),
            kind=kind,
            retryable=retryable,
            retry_after_ms=retry_after,
        )

    def _stream_error(self, error: ServerError) -> ModelError:
        kind, retryable = classify_error(None, error)
        return ModelError(
            self._redact(f"{self._where()} sent an error in its stream{_describe(error)}"),
            kind=kind,
            retryable=retryable,
        )

    def _misread(self, exc: httpx.StreamError) -> ModelError:
        return ModelError(
            self._redact(
                f"the adapter could not read the response of {self._where()} ({type(exc).__name__}: {exc}); this is "
                "a bug in the adapter, and sending the request again would meet it again"
            ),
            kind="invalid_stream",
        )

    def _transport_error(self, exc: httpx.HTTPError | httpx.InvalidURL, started: bool) -> ModelError:
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if isinstance(exc, httpx.TimeoutException):
            return ModelError(
                self._redact(f"{self._where()} stayed silent past the timeout ({self.timeout_s:g} s): {what}"),
                kind="timeout",
            )
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
            return ModelError(self._redact(f"{self._where()}: {what}"), kind="bad_request")
        if started:
            return ModelError(
                self._redact(
                    f"the stream from {self._where()} broke off before it finished ({what}); the partial answer is "
                    "not used, and the request may be sent again"
                ),
                kind="cut_stream",
            )
        return ModelError(self._redact(f"could not reach {self._where()}: {what}"), kind="connection")

    def _too_large(self, why: str | None = None) -> ModelError:
        return ModelError(
            f"{self._where()} sent more than the adapter reads "
            f"({why or f'a body past {MAX_RESPONSE_BYTES} bytes'}); the response is not used",
            kind="response_too_large",
        )

    def _where(self) -> str:
        return f"model {self._model!r} at {self.url}"

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[api key]") if self._api_key else text


def _describe(error: ServerError) -> str:
    parts = [f"code {error.code}" if error.code is not None else "", f"type {error.type}" if error.type else ""]
    details = ", ".join(part for part in parts if part)
    message = error.message[:MAX_ERROR_MESSAGE_CHARS]
    text = f": {message}" if message else ""
    return text + (f" ({details})" if details else "")


def _as_chunk(payload: object) -> dict[str, Any]:
    """A whole (non-streamed) ``chat.completion`` as one chunk: each choice's ``message`` as its delta."""
    if not isinstance(payload, dict):
        return {}
    choices = []
    for choice in payload.get("choices") or ():
        if isinstance(choice, dict):
            choices.append({**choice, "delta": choice.get("message") or {}})
    return {"choices": choices, "usage": payload.get("usage")}
