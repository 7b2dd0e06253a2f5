"""The agent layer's names on records, which the owner, the workers and the readers all match: the kind prefixes of a
run's task and of a tool call's task, and the kinds of a run's transcript entries (with the data and id of the one both
the owner and a worker write, ``tether.aborted_answer``). Defined once, here."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ._frames import OperationRecord

_ENTRY_IDS: Final = uuid.UUID("9d3b6f0e-2c41-4a8e-b7d5-1e6a0c8f4b27")

AGENT_TASK_PREFIX: Final = "agent:"
"""A run's task has kind ``agent:<agent name>``."""
TOOL_TASK_PREFIX: Final = "tool:"
"""A tool call's task has kind ``tool:<tool name>``."""
RESERVED_ENTRY_PREFIX: Final = "tether."
"""Entry kinds under this prefix are the runtime's: the owner writes ``tether.user`` (and a ``tether.aborted_answer``
as a run ends), and a run's own task (or a tool task it owns) writes the others in the run's conversation, under its
lease. The owner refuses them from anyone else (``invalid``), so no client can forge what a model reads."""
USER_ENTRY: Final = "tether.user"
"""The entry of a run's input (written by the owner when the run is admitted)."""
ASSISTANT_ENTRY: Final = "tether.assistant"
"""The entry of a model turn: its text and tool calls."""
TOOL_RESULT_ENTRY: Final = "tether.tool_result"
"""The entry of a tool call's result."""
ABORTED_ANSWER_ENTRY: Final = "tether.aborted_answer"
"""What a model had streamed of an attempt that was cut off (its worker killed, its lease lost) or failed: kept by the
worker when the next attempt of its request starts (in the commit of that attempt's intent, placed before the answer
that replaces it) or with the failure, and by the owner in the commit that ends the run when no attempt follows an
interrupted one. ``{run_id, turn, operation_id, attempt, ended, text}`` (and ``truncated``), ``ended`` the attempt's
status (``interrupted`` or ``failed``). For people only: never an answer, never sent to the model."""
MAX_ABORTED_ANSWER_BYTES: Final = 64 << 10
"""At most this much of an attempt's streamed text is kept in its ``tether.aborted_answer`` entry (the first part, cut
at a character; ``truncated`` says that more had streamed), so the entry fits the commit that carries it."""


def aborted_answer_data(
    *, run_id: str, turn: int, operation_id: str, attempt: int, ended: str, text: str
) -> dict[str, Any]:
    """The data of a ``tether.aborted_answer`` entry, its ``text`` cut to :data:`MAX_ABORTED_ANSWER_BYTES`. Built
    here, the same for the worker (which keeps an attempt's text when the next one starts, or with its failure) and
    the owner (which keeps it when the run ends instead)."""
    raw = text.encode("utf-8", "surrogatepass")
    kept = text
    if len(raw) > MAX_ABORTED_ANSWER_BYTES:
        kept = raw[:MAX_ABORTED_ANSWER_BYTES].decode("utf-8", "ignore")  # drops a character cut in half
    data: dict[str, Any] = {
        "run_id": run_id,
        "turn": turn,
        "operation_id": operation_id,
        "attempt": attempt,
        "ended": ended,
        "text": kept,
    }
    if len(kept) < len(text):
        data["truncated"] = True
    return data


def kept_answer(op: OperationRecord | None, *, status: str, attempt: int, text: str) -> dict[str, Any] | None:
    """The ``tether.aborted_answer`` data of an interrupted model request's attempt, given its stored output
    (``status``, ``attempt`` and ``text`` of its partial record), or ``None`` when there is nothing to keep: the
    request is not ``interrupted`` (a failed attempt keeps its text with its failure), its stored output is not that
    attempt's aborted text (a later attempt started; a close withdrew it, at the attempt before), or it streamed
    nothing. One rule for whoever keeps it: the worker, in the commit of the next attempt's intent, and the owner, in
    the commit that ends the run when no attempt follows."""
    if op is None or op.kind != "model" or op.status != "interrupted":
        return None
    if status != "aborted" or attempt != op.attempt or not text:
        return None
    return aborted_answer_data(
        run_id=op.run_id,
        turn=op.turn,
        operation_id=op.operation_id,
        attempt=op.attempt,
        ended="interrupted",
        text=text,
    )


def aborted_answer_entry_id(operation_id: str, attempt: int) -> str:
    """The id of the ``tether.aborted_answer`` entry of attempt ``attempt`` of a model request: derived, so whoever
    keeps it (a worker, or the owner as the run ends) writes the same id, and the owner refuses it twice."""
    return str(uuid.uuid5(_ENTRY_IDS, f"{operation_id}/aborted_answer/{attempt}"))


RESET_ENTRY: Final = "tether.reset"
"""A reset (``client.reset``): the model's context starts again after it, from its ``handoff`` text (a user message)
when it has one. Older entries stay in storage. Written by the owner."""
CONFIG_DOCUMENT: Final = "tether.config"
"""A conversation's configuration (``configure``): a document the owner writes, versioned like any; documents named
under ``tether.`` are the owner's (a ``put_document`` of one is refused ``invalid``)."""
CONFIG_FIELDS: Final = ("model", "tools", "instructions", "max_turns", "steering", "follow_ups", "after_failed_run")
"""What a conversation's configuration may set; an absent field follows the agent's definition (or the default)."""
