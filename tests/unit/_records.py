"""Record builders the unit tests share: a partial-output record and an operation record with test defaults
(short ids ``op``, ``r``, ``c``, ``t``; every time 0). Pass the ids a test module uses where they differ."""

from __future__ import annotations

from protocol import OperationRecord, PartialRecord


def partial_record(
    offset: int,
    text: str,
    *,
    seq: int,
    attempt: int = 1,
    status: str = "streaming",
    op: str = "op",
    run_id: str = "r",
    conversation_id: str = "c",
) -> PartialRecord:
    """Operation ``op``'s partial output ``text`` from character ``offset``, as of commit ``seq``."""
    return PartialRecord(
        operation_id=op,
        run_id=run_id,
        conversation_id=conversation_id,
        attempt=attempt,
        offset=offset,
        text=text,
        status=status,  # type: ignore[arg-type]
        seq=seq,
        created_at_ms=0,
    )


def operation_record(
    status: str,
    *,
    seq: int,
    attempt: int = 1,
    kind: str = "model",
    name: str = "scripted",
    op: str = "op",
    run_id: str = "r",
    conversation_id: str = "c",
    task_id: str = "t",
) -> OperationRecord:
    """Operation ``op`` (a model request by default) in ``status``, as of commit ``seq``."""
    return OperationRecord(
        operation_id=op,
        run_id=run_id,
        conversation_id=conversation_id,
        task_id=task_id,
        kind=kind,  # type: ignore[arg-type]
        name=name,
        version=1,
        turn=1,
        attempt=attempt,
        digest="d",
        status=status,  # type: ignore[arg-type]
        seq=seq,
        created_at_ms=0,
        updated_at_ms=0,
    )
