"""A run's status, sans-IO: derived from its task and the live tasks it owns, never set independently (``_runs`` rule
3; docs/runs.md, "Run states", prints the table :func:`run_status` follows).
"""

from __future__ import annotations

from typing import Final

import attrs

from protocol import MAX_RUN_ERROR_CHARS, TOOL_TASK_PREFIX, JsonValue, RunAnswer, RunStatus, TaskRecord

from ._ports import TaskReads
from ._run_rules import ORPHANED
from ._tasks import TaskEngine

TOOL_KIND_PREFIX: Final = TOOL_TASK_PREFIX
ATTENTION_KIND: Final = "tether.attention"
"""The external task a run's task waits on while a person reconciles an interrupted manual tool call."""
APPROVAL_KIND: Final = "tether.approval"
"""The external task a tool task waits on while an approval is open."""
QUESTION_KIND: Final = "tether.question"
"""The external task a tool call's handler waits for while a question it asked (``call.ask``) is open."""
INTERACTION_KINDS: Final = frozenset({APPROVAL_KIND, QUESTION_KIND})
"""The external tasks of interactions: live while a person is asked something."""


@attrs.frozen
class Derived:
    status: RunStatus
    reason: str | None = None
    operation_id: str | None = None
    error: str | None = None
    """Why a ``failed`` run failed: its task's error text, cut at :data:`MAX_RUN_ERROR_CHARS`."""
    unanswered: str | None = None
    """Why its inputs settle ``unanswered``, where that is not the run's reason: an orphaned run's are its task's
    blocked reason (``missing_task``, ``task_too_old``, ``migration_failed``)."""


def run_error(text: str | None) -> str | None:
    """``text`` as a run record's ``error``: at most :data:`MAX_RUN_ERROR_CHARS` characters, a cut one ending in
    ``…`` (the task's outcome keeps the whole text)."""
    if text is None or len(text) <= MAX_RUN_ERROR_CHARS:
        return text
    return text[: MAX_RUN_ERROR_CHARS - 1] + "…"


def run_status(
    task: TaskRecord | None,
    *,
    blocked: str | None = None,
    attention: str | None = None,
    tool_missing: str | None = None,
    approval: str | None = None,
) -> Derived:
    """A run's status, from its task (``None``: not admitted yet) and what it owns. Rules, first match wins:

    ====================================  =========================================  ===============================
    run task                              what else                                  run status (reason)
    ====================================  =========================================  ===============================
    none                                                                             ``queued``
    terminal ``completed``                                                           ``completed``
    terminal ``orphaned``                                                            ``failed`` (``orphaned``;
                                                                                     its inputs: the blocked
                                                                                     reason)
    terminal ``aborted`` (or marked                                                  ``cancelled``
    ``abort`` and terminal otherwise)
    terminal otherwise                                                               ``failed`` (outcome's reason,
                                                                                     else its status)
    marked ``abort`` (being cancelled)                                               ``retry_wait`` if sleeping,
                                                                                     ``pending`` if pending, else
                                                                                     ``running`` (``cancelling``)
    ``sleeping``                                                                     ``retry_wait``
    ``running``, ``completing``                                                      ``running``
    ``pending``                           blocked ``task_too_old`` or                ``needs_attention``
                                          ``migration_failed``                       (``agent_version_missing``)
    ``pending``                           blocked ``missing_task``                   ``pending`` (``agent_missing``)
    ``pending``                           blocked ``missing_model``                  ``needs_attention``
                                                                                     (``no_model``)
    ``pending``                           otherwise                                  ``pending``
    ``waiting``                           a live ``tether.attention`` it owns        ``needs_attention``
                                                                                     (``tool_interrupted``, its op)
    ``waiting``                           a pending tool task it owns blocked        ``needs_attention``
                                          ``task_too_old`` / ``migration_failed``    (``tool_missing``, its op)
    ``waiting``                           a live ``tether.approval`` or              ``waiting`` (its operation)
                                          ``tether.question`` it owns
    ``waiting``                           otherwise (its tools run)                  ``running``
    ====================================  =========================================  ===============================

    ``agent_missing`` (no attached worker announces the agent) keeps the run ``pending``, holding its capacity: it
    goes on by itself once one attaches, as at an owner's start before its workers are back.

    ``blocked`` is the run task's blocked reason (derived from the attached workers), ``attention`` and
    ``approval`` the operation ids of the live external tasks it owns (transitively), if any, ``tool_missing`` the
    operation id of a pending tool task it owns that no attached worker can run.
    """
    if task is None:
        return Derived("queued")
    status = task.status
    if status == "terminal":
        outcome = task.outcome
        assert outcome is not None
        if outcome.status == "completed":
            return Derived("completed")
        if outcome.status == "orphaned":
            # Marked for abort while no attached worker could run it (its abort handler never ran): a failure, which
            # says so, its inputs carrying why (the reference's ``orphaned``; never shown as an ordinary cancel).
            why = outcome.reason or "missing_task"
            error = f"the run's task was orphaned ({why}): {outcome.error or 'no attached worker could run it'}"
            return Derived("failed", ORPHANED, error=run_error(error), unanswered=why)
        if outcome.status == "aborted" or task.abort == "abort":
            return Derived("cancelled")
        return Derived("failed", outcome.reason or outcome.status, error=run_error(outcome.error))
    if task.abort == "abort":
        # Being cancelled: nobody is asked anything any more; it ends ``cancelled`` once its task is terminal.
        return Derived(
            "retry_wait" if status == "sleeping" else "pending" if status == "pending" else "running", "cancelling"
        )
    if status == "sleeping":
        return Derived("retry_wait")
    if status in ("running", "completing"):
        return Derived("running")
    if status == "pending":
        if blocked in ("task_too_old", "migration_failed"):
            return Derived("needs_attention", "agent_version_missing")
        if blocked == "missing_task":
            return Derived("pending", "agent_missing")
        if blocked == "missing_model":
            return Derived("needs_attention", "no_model")
        return Derived("pending")
    if attention is not None:
        return Derived("needs_attention", "tool_interrupted", attention)
    if tool_missing is not None:
        return Derived("needs_attention", "tool_missing", tool_missing)
    if approval is not None:
        return Derived("waiting", None, approval)
    return Derived("running")


def answer_of(task: TaskRecord) -> RunAnswer | None:
    """A completed run's answer: its task's result ``{"text": ...}``, at the seq of the commit that completed it
    (the commit that also appended the final assistant entry)."""
    outcome = task.outcome
    if task.status != "terminal" or outcome is None or outcome.status != "completed":
        return None
    result = outcome.result
    if isinstance(result, dict) and isinstance(result.get("text"), str):
        return RunAnswer(seq=task.seq, text=result["text"], value=JsonValue(result.get("value")))
    return None


def derive(task: TaskRecord, tasks: TaskEngine, stored_tasks: TaskReads) -> Derived:
    """A run's status from its task (admitted: it has one), reading what :func:`run_status` needs of the live tasks
    it owns and of the attached workers."""
    blocked = None
    attention = tool_missing = approval = None
    if task.status == "pending":
        blocked = tasks.blocked_reason_of(task)
    elif task.status == "waiting":
        for owned in tasks.live_descendants(task.task_id):
            if owned.kind == ATTENTION_KIND and attention is None:
                attention = _operation_of(owned, stored_tasks)
            elif owned.kind in INTERACTION_KINDS and approval is None:
                approval = _operation_of(owned, stored_tasks)
            elif tool_missing is None and _tool_missing(owned, tasks):
                tool_missing = _operation_of(owned, stored_tasks)
    return run_status(task, blocked=blocked, attention=attention, tool_missing=tool_missing, approval=approval)


def _tool_missing(owned: TaskRecord, tasks: TaskEngine) -> bool:
    """Whether ``owned`` is a pending tool call stored at a tool version no attached worker can run: newer than
    every attached definition of the tool, or one without a migration (``task_too_old`` / ``migration_failed``).
    With no worker for the tool at all (``missing_task``) the workers are coming back, as for an agent: not a
    cause for attention (a split deployment whose tool workers reattach after its agent workers would otherwise
    free capacity for a moment and overrun ``max_concurrent_runs`` once they are back)."""
    if not owned.kind.startswith(TOOL_KIND_PREFIX) or owned.status != "pending" or owned.abort is not None:
        return False
    return tasks.blocked_reason_of(owned) in ("task_too_old", "migration_failed")


def _operation_of(external: TaskRecord, stored_tasks: TaskReads) -> str:
    """The operation an external task is about (its input's ``operation_id``)."""
    input_value, _ = stored_tasks.task_data(external.task_id)
    if isinstance(input_value, dict) and isinstance(input_value.get("operation_id"), str):
        return str(input_value["operation_id"])
    return external.task_id
