"""``actors.OpenAIChat``: a model that speaks the Chat Completions API with streaming, over httpx and httpx-sse.

It serves OpenAI and the OpenAI-compatible servers people run (vLLM, llama.cpp's server, Ollama, LiteLLM,
OpenRouter). No vendor SDK: its retries would stack on Tether's durable ones; here every failure becomes one
:class:`~actors.ModelError` with a kind (retryable or final) and the run loop decides, durably, what happens next.

:class:`OpenAIChat` does the HTTP, and maps every httpx error and every error response or error object in the stream
to a :class:`~actors.ModelError` at that one boundary (:func:`~actors._models._openai_wire.classify_error`). What it
sends and reads is decoded sans-IO in ``_openai_wire.py``: the request's messages, the event stream
(:class:`~actors._models._openai_wire.SSEParser`, :class:`~actors._models._openai_wire.ChatStreamDecoder`) and error
bodies.
"""

from __future__ import annotations

import json
import math
import os
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import httpx
from httpx_sse import aconnect_sse

from protocol import UsageError, check_json

from ._model import ModelError, ModelRequest, StreamEvent
from ._openai_wire import ChatStreamDecoder, ServerError, SSEParser, classify_error, parse_retry_after, request_messages

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"
API_KEY_ENV: Final = "OPENAI_API_KEY"
BASE_URL_ENV: Final = "OPENAI_BASE_URL"
DEFAULT_TIMEOUT_S: Final = 600.0
"""The longest the server may stay silent (between two reads of the stream, or before it answers)."""
CONNECT_TIMEOUT_S: Final = 10.0
"""Connecting takes at most this (or ``timeout_s`` when that is shorter)."""
MAX_RESPONSE_BYTES: Final = 32 * 1024 * 1024
"""The most a response body may carry (decoded); past it the request fails, final ``response_too_large``."""
MAX_ERROR_BODY_BYTES: Final = 64 * 1024
"""How much of an error response's body is read to find the server's message."""
MAX_ERROR_MESSAGE_CHARS: Final = 1000
"""How much of the server's message an error's text quotes."""
RESERVED_BODY_KEYS: Final = frozenset({"model", "messages", "stream", "tools"})
"""Request fields the adapter writes itself; ``extra_body`` may not replace them."""
USER_AGENT: Final = "tether (actors.OpenAIChat)"


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
        if request.output_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": dict(request.output_schema)},
            }
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
