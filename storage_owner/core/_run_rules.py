"""The rules of a run that need no room, sans-IO: its state machine (:data:`RUN_TRANSITIONS`, which ``_runs`` checks
on every put and ``docs/runs.md`` prints), the statuses it groups, the reasons rule 7 writes, and the ids the owner
derives from a run (``_runs`` rule 4). ``_runs`` holds the room that applies them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Final, Literal

from protocol import AGENT_TASK_PREFIX, RUN_ACTIVE, RUN_TERMINAL, TOOL_TASK_PREFIX, RunRecord, RunStatus

DEFAULT_MAX_CONCURRENT_RUNS: Final = 64
MAX_INPUT_BYTES: Final = 1 << 20
"""An input's text: 1 byte to this many."""
AGENT_KIND_PREFIX: Final = AGENT_TASK_PREFIX
TOOL_KIND_PREFIX: Final = TOOL_TASK_PREFIX
EXTERNAL_KIND_PREFIX: Final = "tether."
BUSY: Final = frozenset({"pending", "running", "retry_wait"})
"""Statuses that take global capacity (``max_concurrent_runs``)."""
ACTIVE: Final = frozenset(RUN_ACTIVE)
TERMINAL: Final = frozenset(RUN_TERMINAL)
SETTLED: Final = frozenset({*RUN_TERMINAL, "needs_attention"})
"""Statuses that answer ``wait_run``."""
HELD: Final = "held"
"""The reason of a queued run held after the run before it failed (rule 7: ``after_failed_run="wait"``)."""
RUN_FAILED: Final = "run_failed"
"""Why an input queued behind a failed run settled ``unanswered`` (rule 7: ``after_failed_run="withdraw"``)."""
ORPHANED: Final = "orphaned"
"""The reason of a run whose task was orphaned: marked for abort (cancelled, or its owner aborted) while no attached
worker could run it (its kind or version gone, its migration failed), past the orphan grace."""
NOT_HOLDING: Final = frozenset({"reset", ORPHANED})
"""The reasons of failed runs that hold nothing queued behind them (rule 7): a reset a person placed (what follows
runs in the new context), and an orphaned run, which someone aborted (the reference's list of holding failures does
not name it). Every other failure holds: ``model_error``, ``no_model``, ``nothing_to_answer``, ``max_turns``,
``model_retries_exhausted``, ``restart_limit``, the faults, ``budget_exceeded``, ``invalid_output``."""
_RUN_IDS: Final = uuid.UUID("9f1c3c1e-5a0e-4c43-9a53-0e5f2f1d7a10")

RunEvent = Literal["admit", "refuse", "cancel", "derive", "account", "retry", "hold", "release"]
DERIVED: Final[frozenset[RunStatus]] = frozenset(
    {"pending", "retry_wait", "running", "waiting", "needs_attention", "completed", "failed", "cancelled"}
)
"""What a status derived from a task may be: anything but ``queued`` (a run with a task is never queued)."""

RUN_TRANSITIONS: Final[Mapping[tuple[RunStatus, RunEvent], frozenset[RunStatus]]] = {
    ("queued", "admit"): frozenset({"pending"}),  # 2
    ("queued", "refuse"): frozenset({"failed"}),  # 2 (not_admitted)
    ("queued", "cancel"): frozenset({"cancelled"}),  # 5
    ("queued", "hold"): frozenset({"queued"}),  # 7 (reason held)
    ("queued", "release"): frozenset({"queued"}),  # 7
    ("pending", "derive"): DERIVED,  # 3
    ("retry_wait", "derive"): DERIVED,  # 3
    ("running", "derive"): DERIVED,  # 3
    ("waiting", "derive"): DERIVED,  # 3
    ("needs_attention", "derive"): DERIVED,  # 3
    ("pending", "account"): frozenset({"pending"}),  # 3 (a result's usage)
    ("retry_wait", "account"): frozenset({"retry_wait"}),  # 3
    ("running", "account"): frozenset({"running"}),  # 3
    ("waiting", "account"): frozenset({"waiting"}),  # 3
    ("needs_attention", "account"): frozenset({"needs_attention"}),  # 3
    ("failed", "retry"): frozenset({"queued"}),  # 6
}
"""The run state machine: from a status, on an event, the statuses a run may take; see the module docstring for the
rules each row follows. Nothing else leaves ``completed``, ``failed`` or ``cancelled``."""


def queued_run(submission_id: str, conversation_id: str, agent: str, seq: int, now_ms: int) -> RunRecord:
    return RunRecord(
        run_id=submission_id,
        conversation_id=conversation_id,
        agent=agent,
        version=0,
        status="queued",
        submission_id=submission_id,
        seq=seq,
        created_at_ms=now_ms,
        updated_at_ms=now_ms,
    )


def holds_queue(run: RunRecord) -> bool:
    """Whether ``run``, which has just ended, holds what is queued behind it as its conversation's
    ``after_failed_run`` says (rule 7): only a failure does (not a reset, not an orphaned run), never an answer or a
    cancel (someone stopped it: the next run starts at once)."""
    return run.status == "failed" and run.reason not in NOT_HOLDING


def is_held(run: RunRecord) -> bool:
    """Whether ``run`` waits held after a failed run (rule 7)."""
    return run.status == "queued" and run.reason == HELD


def admissible(run: RunRecord) -> bool:
    """Whether ``run``, at the head of its conversation's queue, may be admitted (rule 7: not held)."""
    return run.status == "queued" and run.reason != HELD


def run_task_id(run_id: str, attempt: int) -> str:
    """The id of a run's ``attempt``-th task (1 for its admission, more after ``retry_run``)."""
    return str(uuid.uuid5(_RUN_IDS, f"{run_id}/task/{attempt}"))


def user_entry_id(run_id: str) -> str:
    return str(uuid.uuid5(_RUN_IDS, f"{run_id}/user"))


def attention_task_id(operation_id: str, attempt: int) -> str:
    """The ``tether.attention`` task the owner creates when attempt ``attempt`` of a manual tool call is cut off."""
    return str(uuid.uuid5(_RUN_IDS, f"{operation_id}/attention/{attempt}"))
