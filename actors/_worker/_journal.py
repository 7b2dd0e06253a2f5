"""The operation journal as the run loop reads and writes it, for run tasks and tool tasks alike: derived ids and
digests, reading one operation, committing an intent (on a guess that saves a read), and the result entry and the
journal records of a call that runs nothing.

Ids are derived (uuid5) from the run, its task, the turn and the model's call id, never drawn at random, so a
re-run derives the same operation, task and entry ids.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

from protocol import (
    AGENT_TASK_PREFIX,
    TOOL_RESULT_ENTRY,
    TOOL_TASK_PREFIX,
    Conflict,
    FinishOperation,
    JsonValue,
    NotFound,
    OperationRecord,
    RecoveryPolicy,
    RunUsage,
    StartOperation,
    ToolErrorCode,
    digest_json,
    json_value,
)

from .._app._tools import ToolDefinition
from .._models._model import Usage
from ._phase import Phase, PhaseTransaction

AGENT_PREFIX: Final = AGENT_TASK_PREFIX
TOOL_PREFIX: Final = TOOL_TASK_PREFIX
_IDS: Final = uuid.UUID("3f6c2a59-0d1e-4b8f-a7c4-6e2b91d05c37")


def _derived(*parts: object) -> str:
    return str(uuid.uuid5(_IDS, "/".join(str(part) for part in parts)))


def model_operation_id(run_id: str, turn: int) -> str:
    """The operation of a run's ``turn``-th model request: the same for every task of the run (a retried run finds
    the turns already answered)."""
    return _derived(run_id, "model", turn)


def tool_operation_id(run_id: str, turn: int, call_id: str) -> str:
    """The operation of the tool call ``call_id`` of a run's ``turn``: the same for every attempt of the call."""
    return _derived(run_id, "tool", turn, call_id)


def digest(value: Any) -> str:
    """The sha256 of ``value`` as canonical JSON (:func:`protocol.digest_json`)."""
    return hashlib.sha256(digest_json(value).encode()).hexdigest()


def run_usage(usage: Usage | None) -> RunUsage | None:
    """A model's or a tool's usage as the journal records it."""
    if usage is None:
        return None
    return RunUsage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cached_tokens=usage.cached_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        cost=usage.cost,
    )


def content_text(value: Any) -> str:
    """A tool's result as the text a model reads: a string as is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


async def journaled(rt: Phase, operation_id: str) -> OperationRecord | None:
    """The operation ``operation_id`` as the journal holds it, or ``None`` before its first intent. One read of one
    record: a phase never reads the whole run's journal (that made a long run quadratic)."""
    try:
        return await rt.client.operation(operation_id)
    except NotFound:
        return None


CONFIRMED_POLICIES: Final = frozenset({"manual", "report"})
"""Tool calls whose handler starts only once the owner confirmed the lease (a round trip after the intent): their
cut-off needs a person (or ends in an error result), so a paused worker must never start one under a lease it lost."""


async def _start(
    rt: Phase, write: StartOperation, guessed: bool, also: Callable[[PhaseTransaction], None] | None = None
) -> bool:
    """Commit an operation's intent (with what ``also`` adds to its commit). ``guessed``: the phase did not read the
    journal, on the guess that a fresh state (never cut off) has no attempt of the operation yet; the owner checks
    every intent against the journal, so a wrong guess is refused (``conflict``, nothing written) and answers
    ``False``: read the journal and decide again. A right guess saves a read of the journal per model request and per
    tool call.

    Once committed, the operation starts only under a lease known live (:meth:`Phase.ensure_lease`: a round trip
    after a pause or a silence, and always for a ``manual`` or ``report`` tool call), else
    :class:`~protocol.StaleLease` is raised and nothing starts."""
    try:
        async with rt.commit() as tx:
            tx.start_operation(write)
            if also is not None:
                also(tx)
    except Conflict:
        if not guessed:
            raise
        return False
    await rt.ensure_lease(always=write.kind == "tool" and write.policy in CONFIRMED_POLICIES)
    return True


def _fresh(rt: Phase) -> bool:
    """Whether this run of the phase is its state's first (nothing cut off: no attempt it started is journaled) in
    its run's first task: a run's task after ``retry_run`` (input ``attempt`` above 1), and the tool tasks it creates
    (input ``run_attempt``), go on from a journal the earlier tasks wrote, so a guess would be refused there."""
    return (
        rt.restarts == 0
        and rt.mode == "phase"
        and "attempt" not in rt.checkpoint
        and _run_attempt(rt.input, "attempt") == 1
        and _run_attempt(rt.input, "run_attempt") == 1
    )


def _run_attempt(value: Any, key: str) -> int:
    """Which task of its run (1 for the first) a task's input says it is or belongs to, under ``key``."""
    attempt = value.get(key, 1) if isinstance(value, dict) else 1
    return attempt if type(attempt) is int else 1


def _result_entry(
    tx: PhaseTransaction,
    conversation_id: str,
    *,
    run_id: str,
    operation_id: str,
    call_id: str,
    name: str,
    content: str,
    is_error: bool,
    code: ToolErrorCode | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """The call's ``tether.tool_result`` entry: what the model reads (``content``), an error result's ``code``, and
    what a :class:`ToolResult` adds for people and the run (``extra``: ``details``, ``terminate``, ``handoff``; only
    what it gave). Its ``structured`` value is not here: programs read it from the journal."""
    tx.append(
        conversation_id,
        kind=TOOL_RESULT_ENTRY,
        entry_id=_derived(operation_id, "result"),
        data={
            "run_id": run_id,
            "operation_id": operation_id,
            "call_id": call_id,
            "name": name,
            "content": content,
            "is_error": is_error,
            **({} if code is None else {"code": code}),
            **(extra or {}),
        },
    )


def tool_intent(
    tool: ToolDefinition,
    *,
    run_id: str,
    operation_id: str,
    turn: int,
    call_id: str,
    arguments: Any,
    attempt: int = 1,
    policy: RecoveryPolicy | None = None,
    parent_operation_id: str | None = None,
    task_id: str | None = None,
) -> StartOperation:
    """The intent of a call of ``tool`` with ``arguments``: its attempt, under ``policy`` (the tool's own by default;
    a later attempt keeps the stored one), naming its caller for a nested call and its task when the model result's
    commit writes it (``task_id``)."""
    return StartOperation(
        operation_id=operation_id,
        run_id=run_id,
        kind="tool",
        name=tool.name,
        version=tool.version,
        turn=turn,
        attempt=attempt,
        digest=digest(arguments),
        tool_call_id=call_id,
        policy=tool.recovery if policy is None else policy,
        arguments=json_value(arguments),
        parent_operation_id=parent_operation_id,
        task_id=task_id,
    )


def _refused_call(
    tx: PhaseTransaction,
    tool: ToolDefinition,
    *,
    run_id: str,
    operation_id: str,
    turn: int,
    call_id: str,
    arguments: Any,
    error: str,
    code: ToolErrorCode,
    parent_operation_id: str | None = None,
) -> None:
    """Journal a call of ``tool`` that runs nothing (arguments that are not JSON or fail its schema, a denial): its
    intent and its ``failed`` result (the error the model sees) in the commit that writes its result entry, so the
    journal lists it and a call and its result still land together. Never for a call that started an attempt."""
    tx.start_operation(
        tool_intent(
            tool,
            run_id=run_id,
            operation_id=operation_id,
            turn=turn,
            call_id=call_id,
            arguments=arguments,
            parent_operation_id=parent_operation_id,
        )
    )
    tx.finish_operation(
        FinishOperation(
            operation_id=operation_id, status="failed", result=JsonValue(error), is_error=True, error=error, code=code
        )
    )
