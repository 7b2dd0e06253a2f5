"""Rules both sides apply, written once in ``protocol``: whether an operation has its final result, and the canonical
JSON that digests and derived ids are computed from (pinned: stored values were computed from it)."""

from __future__ import annotations

import hashlib

import attrs
import pytest

from protocol import JsonValue, OperationRecord, OperationStatus, Retry, digest_json, has_result, operation_key_json

VALUE = {"b": [1, 2.5, "é☃", None, True], "a": {"z": '"q"', "y": ()}}

OPERATION = OperationRecord(
    operation_id="01a22a08-1e43-7c05-a2b3-188080e8f9f1",
    run_id="01a22a08-1e43-7c05-a2b3-188080e8f9f2",
    conversation_id="01a22a08-1e43-7c05-a2b3-188080e8f9f3",
    task_id="01a22a08-1e43-7c05-a2b3-188080e8f9f4",
    kind="model",
    name="gpt",
    version=1,
    turn=0,
    attempt=1,
    arguments=JsonValue(None),
    digest="d",
    status="started",
    seq=1,
    created_at_ms=1,
    updated_at_ms=1,
)


@pytest.mark.parametrize(
    ("kind", "status", "attempt", "retry", "expected"),
    [
        ("model", "started", 1, None, False),
        ("model", "interrupted", 4, None, False),
        ("model", "completed", 1, None, True),
        ("tool", "resolved", 1, None, True),
        ("tool", "failed", 1, None, True),  # a tool's error is its result: the model sees it
        ("model", "failed", 1, None, False),  # attempts left under the default policy (4): retried under the same id
        ("model", "failed", 4, None, True),  # past its last attempt
        ("model", "failed", 2, Retry(attempts=2), True),
        ("model", "failed", 2, Retry(attempts=3), False),
    ],
)
def test_an_operation_has_its_result_once_committed_and_final(
    kind: str, status: OperationStatus, attempt: int, retry: Retry | None, expected: bool
) -> None:
    op = attrs.evolve(OPERATION, kind=kind, status=status, attempt=attempt, retry=retry)
    assert has_result(op) is expected


def test_the_digest_json_keeps_text_as_it_is_and_sorts_keys() -> None:
    assert digest_json(VALUE) == '{"a":{"y":[],"z":"\\"q\\""},"b":[1,2.5,"é☃",null,true]}'
    assert hashlib.sha256(digest_json(VALUE).encode()).hexdigest() == (
        "b6d7a101abbb53d0e74a575b64e697267092d6d0160219c9d0c9ce11338a2a01"
    )
    assert digest_json({"b": 1, "a": 2}) == digest_json({"a": 2, "b": 1})
    with pytest.raises(TypeError):
        digest_json({"k": object()})  # no digest of an approximation


def test_the_operation_key_json_escapes_text_outside_ascii_and_writes_other_values_as_their_repr() -> None:
    assert operation_key_json(VALUE) == '{"a":{"y":[],"z":"\\"q\\""},"b":[1,2.5,"\\u00e9\\u2603",null,true]}'
    assert operation_key_json({"raw": b"\x00"}) == '{"raw":"b\'\\\\x00\'"}'
