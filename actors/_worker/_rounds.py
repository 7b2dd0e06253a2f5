"""A run's tool round as its transcript holds it, for the run loop (``_agent_run.py``): what follows the run's last
assistant entry (the round's results and what the owner placed as the round ended), the reset of the round's
handoff, whether every call asked to end the run, and whether a client's reset ended it. Pure functions of the
entries, so a phase that runs again after a crash decides the same."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from protocol import ASSISTANT_ENTRY, RESET_ENTRY, TOOL_RESULT_ENTRY, USER_ENTRY, EntryRecord

from ._journal import _derived, model_operation_id
from ._phase import PhaseTransaction


def own_handoff(entry: EntryRecord, run_id: str) -> bool:
    """Whether ``entry`` is the reset the run placed for a tool's handoff (a client's names its submission)."""
    return entry.kind == RESET_ENTRY and isinstance(entry.data, dict) and entry.data.get("run_id") == run_id


def place_handoff(
    tx: PhaseTransaction,
    conversation_id: str,
    entries: Sequence[EntryRecord],
    calls: Sequence[Mapping[str, Any]],
    run_id: str,
    turn: int,
) -> None:
    """Add to ``tx`` the reset of the round's handoff: the last call's in call order whose result has one, whatever
    the order they completed in. Its id derives from the round, so a run of the phase again after a crash finds it
    placed. None when no call handed off, or when a client's reset was placed as the round ended (it ends the run:
    ``reset_since_answer``). It follows what the owner placed at the round's end (steers, writes the model sees): the
    new context keeps them after the handoff text (``MessageFold``)."""
    entry_id = _derived(model_operation_id(run_id, turn), "handoff")
    results, placed = round_tail(entries, run_id)
    if any(entry.kind == RESET_ENTRY for entry in placed):
        return  # this round's handoff, placed already; or a client's reset, which ends the run
    for call in reversed(calls):
        result = results.get(str(call["operation_id"]))
        handoff = None if result is None else result.get("handoff")
        if isinstance(handoff, str) and handoff:
            tx.append(
                conversation_id,
                kind=RESET_ENTRY,
                entry_id=entry_id,
                data={"handoff": handoff, "run_id": run_id, "operation_id": call["operation_id"], "name": call["name"]},
            )
            return


def round_tail(entries: Sequence[EntryRecord], run_id: str) -> tuple[dict[str, Mapping[str, Any]], list[EntryRecord]]:
    """What follows the run's last assistant entry (its last tool round): the result entries' data by operation id,
    and every other entry, newest first."""
    results: dict[str, Mapping[str, Any]] = {}
    others: list[EntryRecord] = []
    for entry in reversed(entries):
        data = entry.data if isinstance(entry.data, dict) else {}
        if entry.kind == ASSISTANT_ENTRY and data.get("run_id") == run_id:
            break
        if entry.kind == TOOL_RESULT_ENTRY:
            results[str(data.get("operation_id"))] = data
        else:
            others.append(entry)
    return results, others


def terminated(entries: Sequence[EntryRecord], calls: Sequence[Mapping[str, Any]], run_id: str) -> str | None:
    """The run's answer if every call of its round returned ``terminate=True`` (``ToolResult``) and nothing came
    after the round that the model must see first (a steer or a client's reset placed when it ended; not the run's
    own handoff): the last call's output, in call order. ``None``: the run goes on."""
    results, placed = round_tail(entries, run_id)
    for entry in placed:
        if not own_handoff(entry, run_id) and (entry.kind in (USER_ENTRY, RESET_ENTRY) or entry.model is not None):
            return None  # placed at the round's end: the model answers it
    found = [results.get(str(call["operation_id"])) for call in calls]
    if not found or any(data is None or data.get("terminate") is not True or data.get("is_error") for data in found):
        return None
    last = found[-1]
    assert last is not None
    return str(last.get("content", ""))


def reset_since_answer(entries: Sequence[EntryRecord], run_id: str) -> bool:
    """Whether a client's reset entry follows the run's last assistant entry (its last tool round's calls); the run's
    own handoff is not one: the run goes on from it."""
    for entry in reversed(entries):
        if entry.kind == RESET_ENTRY and not own_handoff(entry, run_id):
            return True
        if entry.kind == ASSISTANT_ENTRY and isinstance(entry.data, dict) and entry.data.get("run_id") == run_id:
            return False
    return False
