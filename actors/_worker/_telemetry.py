"""A worker's spans (``tether[otel]``): one per run of a task's phase, one per model request of a run's turn (the
GenAI semantic conventions), one per tool call's handler. Imported only when telemetry is on (``serve(otel=True)``,
``TETHER_OTEL=1``, ``tether worker --otel``): a worker without it never loads OpenTelemetry, and its phases pay one
attribute check (``Worker._telemetry is None``).

Every span of a run is in the run's trace, under its root span (``protocol.trace_id_of`` / ``root_span_id_of``: both
derived from the run id, so nothing travels on the wire); a phase's model request or tool call is a child of the
phase's span. docs/telemetry.md lists the spans and their attributes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final, Protocol

import trio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from protocol import (
    AGENT_TASK_PREFIX,
    TOOL_TASK_PREFIX,
    BudgetExceeded,
    LeaseRef,
    SetTaskState,
    StaleLease,
    collapse_group,
    root_span_id_of,
    trace_id_of,
)

from .._app._tools import ToolDefinition
from .._models._model import AssistantTurn, ModelError, Usage

SCOPE: Final = "tether.worker"
"""The instrumentation scope of a worker's spans."""
PHASE_SPAN: Final = "tether.phase"

_NEXT_STATE: Final = {"running": "advanced", "waiting": "waiting", "sleeping": "sleeping"}


class PhaseView(Protocol):
    """What the spans read of a phase's run (an :class:`~actors.Phase`; this module imports none of the run loop's
    modules, which hold it)."""

    @property
    def task_id(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def input(self) -> Any: ...

    @property
    def mode(self) -> str: ...

    @property
    def restarts(self) -> int: ...

    @property
    def lease(self) -> LeaseRef: ...

    @property
    def conversation_id(self) -> str | None: ...

    @property
    def end_state(self) -> SetTaskState | None: ...

    @property
    def phase(self) -> str | None: ...


class WorkerTelemetry:
    """The spans of one worker, on ``tracer_provider`` (the global one when ``None``). ``given_back``: the exceptions
    with which a phase gives its lease back unrun (``ModelUnavailable``), its outcome ``given_back``."""

    def __init__(self, tracer_provider: Any = None, *, given_back: tuple[type[BaseException], ...] = ()) -> None:
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self._tracer = provider.get_tracer(SCOPE)
        self._given_back = given_back

    @staticmethod
    def trace_key(rt: PhaseView) -> str:
        """What the phase's trace derives from: its run's id (a run's task, a tool call's task), else its task id."""
        if rt.kind.startswith((AGENT_TASK_PREFIX, TOOL_TASK_PREFIX)) and isinstance(rt.input, dict):
            run_id = rt.input.get("run_id")
            if isinstance(run_id, str):
                return run_id
        return rt.task_id

    @contextlib.contextmanager
    def phase(self, rt: PhaseView) -> Iterator[None]:
        """The span of one run of ``rt``'s phase (current while it runs, so its model request or tool call is its
        child), ended with what the run came to: ``tether.phase.outcome``."""
        key = self.trace_key(rt)
        root = SpanContext(
            trace_id=trace_id_of(key),
            span_id=root_span_id_of(key),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        attributes: dict[str, Any] = {
            "tether.task.id": rt.task_id,
            "tether.task.kind": rt.kind,
            "tether.phase": rt.phase or "abort",
            "tether.phase.mode": rt.mode,
            "tether.phase.restarts": rt.restarts,
            "tether.lease.epoch": rt.lease.epoch,
        }
        if key != rt.task_id:
            attributes["tether.run.id"] = key
        if rt.conversation_id is not None:
            attributes["gen_ai.conversation.id"] = rt.conversation_id
        span = self._tracer.start_span(
            PHASE_SPAN,
            context=trace.set_span_in_context(NonRecordingSpan(root)),
            attributes=attributes,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        outcome = "error"
        try:
            yield
            outcome = _ended_as(rt)
        except BaseException as exc:
            outcome = "given_back" if isinstance(exc, self._given_back) else _stopped_by(exc)
            if outcome == "error":
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                span.set_attribute("error.type", type(exc).__qualname__)
            raise
        finally:
            span.set_attribute("tether.phase.outcome", outcome)
            if outcome == "faulted":
                span.set_status(Status(StatusCode.ERROR, "the phase faulted"))
            otel_context.detach(token)
            span.end()

    def start_model_request(self, model: str, operation_id: str, turn: int, attempt: int) -> ModelRequestSpan:
        """The span of one model request (``chat {model}``, kind CLIENT), a child of the phase's."""
        return ModelRequestSpan(
            self._tracer.start_span(
                f"chat {model}",
                kind=SpanKind.CLIENT,
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": model,
                    "tether.operation.id": operation_id,
                    "tether.turn": turn,
                    "tether.attempt": attempt,
                },
            )
        )

    def start_tool_call(
        self, tool: ToolDefinition, call_id: str, operation_id: str, attempt: int, policy: str
    ) -> ToolCallSpan:
        """The span of one run of a tool call's handler (``execute_tool {name}``), a child of the phase's."""
        return ToolCallSpan(
            self._tracer.start_span(
                f"execute_tool {tool.name}",
                kind=SpanKind.INTERNAL,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool.name,
                    "gen_ai.tool.call.id": call_id,
                    "gen_ai.tool.type": "function",
                    "tether.tool.version": tool.version,
                    "tether.tool.policy": policy,
                    "tether.operation.id": operation_id,
                    "tether.attempt": attempt,
                },
            )
        )


class ModelRequestSpan:
    """A model request's span, started; :meth:`end` it once."""

    def __init__(self, span: Span) -> None:
        self._span = span

    def end(self, turn: AssistantTurn | None, failure: BaseException | None, usage: Usage | None) -> None:
        """End the span with the request's usage and finish reason, or the error that ended it (``usage``: what the
        stream reported before it failed, if it did)."""
        span = self._span
        if turn is not None:
            usage = turn.usage
            span.set_attribute("gen_ai.response.finish_reasons", (turn.finish_reason,))
            span.set_attribute("tether.tool_calls", len(turn.message.tool_calls))
        if usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
            if usage.cached_tokens:
                span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens)
        if failure is not None:
            kind = failure.kind if isinstance(failure, ModelError) else _stopped_by(failure)
            span.set_attribute("error.type", kind)
            if isinstance(failure, ModelError):
                span.set_attribute("tether.model.retryable", failure.retryable)
            span.set_status(Status(StatusCode.ERROR, f"{kind}: {failure}"))
        span.end()


class ToolCallSpan:
    """A tool call's span, started; :meth:`end` (or :meth:`cut_off`) it once."""

    def __init__(self, span: Span) -> None:
        self._span = span

    def cut_off(self, exc: BaseException) -> None:
        """End the span of a handler that ``exc`` stopped (a cancellation, a lost lease...)."""
        outcome = _stopped_by(exc)
        self.end(outcome, exc if outcome == "error" else None)

    def end(self, outcome: str, failure: BaseException | None = None) -> None:
        """End the span with its outcome: ``completed``, ``error`` (the handler raised: ``error.type``
        names the exception), ``invalid_output``, or how the phase was stopped (``cancelled``...)."""
        span = self._span
        span.set_attribute("tether.tool.outcome", outcome)
        span.set_attribute("tether.tool.is_error", outcome != "completed")
        if failure is not None:
            span.set_attribute("error.type", type(failure).__qualname__)
        if outcome != "completed":
            span.set_status(Status(StatusCode.ERROR, outcome if failure is None else f"{outcome}: {failure}"))
        span.end()


def _ended_as(rt: PhaseView) -> str:
    """What a phase run that returned came to: the next state it committed (``advanced``, ``waiting``,
    ``sleeping``), or its task's outcome (``completed``, ``failed``, ``faulted``, ``aborted``)."""
    state = rt.end_state
    if state is None:
        return "no_commit"
    if state.outcome is not None:
        return state.outcome.status
    return _NEXT_STATE.get(state.status, state.status)


def _stopped_by(exc: BaseException) -> str:
    """How an exception out of a phase ends its span: ``cancelled`` (the lease was cancelled or lost, the worker
    stopped at once), ``stale_lease``, ``budget_exceeded``, else ``error``."""
    if isinstance(exc, BaseExceptionGroup):
        exc = collapse_group(exc)
    if isinstance(exc, trio.Cancelled):
        return "cancelled"
    if isinstance(exc, StaleLease):
        return "stale_lease"
    if isinstance(exc, BudgetExceeded):
        return "budget_exceeded"
    return "error"
