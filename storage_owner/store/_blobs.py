"""How a store keeps values: application values and whole records as msgpack blobs, one definition for both stores
(the SQLite store's columns, the memory store's dicts), so that a value reads back from either the same: detached from
the caller's objects, with msgpack's types (a tuple reads back as a list). Sans-IO."""

from __future__ import annotations

from typing import Any, Final

import msgpack

from protocol import InteractionRecord, OperationRecord, Record, TaskOutcome, converter

RECORDS = tuple[Record, ...]
"""What one commit of the log holds."""
structure_records: Final = converter.get_structure_hook(RECORDS)
unstructure_records: Final = converter.get_unstructure_hook(RECORDS)
structure_outcome: Final = converter.get_structure_hook(TaskOutcome)
unstructure_outcome: Final = converter.get_unstructure_hook(TaskOutcome)
structure_interaction: Final = converter.get_structure_hook(InteractionRecord)
_structure_operation: Final = converter.get_structure_hook(OperationRecord)
_unstructure_operation: Final = converter.get_unstructure_hook(OperationRecord)
_unstructure_interaction: Final = converter.get_unstructure_hook(InteractionRecord)


def pack(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(blob: bytes) -> Any:
    return msgpack.unpackb(blob, raw=False)


def pack_operation(record: OperationRecord) -> bytes:
    return pack(_unstructure_operation(record))


def unpack_operation(blob: bytes) -> OperationRecord:
    return _structure_operation(unpack(blob), OperationRecord)  # type: ignore[no-any-return]


def pack_interaction(record: InteractionRecord) -> bytes:
    return pack(_unstructure_interaction(record))
