"""Refusals, the checks every request handler shares, and the check every record's transition table is held to."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Final, TypeVar

from protocol import ErrorCode, is_id

MAX_NAME_CHARS: Final = 200
MAX_READ_LIMIT: Final = 1000
"""The most records one read asks for (``limit``); a reply page may end sooner at the read budget (``_output``)."""
MAX_CURSOR: Final = (1 << 62) - 1


class Refusal(Exception):
    """Raised by a request handler (or the task engine under it) to refuse the request. The core turns it into the
    ``Error`` reply in one place; a write handler rolls its savepoint back (with everything the request changed in
    memory) on the way out."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


S = TypeVar("S", bound=str)
E = TypeVar("E", bound=str)


class IllegalTransition(Exception):
    """A change of a record's status that its transition table forbids: a bug in the owner, never bad input (that is
    refused before any change). Raised, not asserted, so it holds under ``python -O``; never caught in the core (the
    owner fails closed and restarts from the last commit)."""

    def __init__(self, record: str, key: str, status: str, event: str, to: str) -> None:
        super().__init__(f"{record} {key}: no transition from {status} on {event} to {to}")
        self.record = record
        self.key = key
        self.status = status
        self.event = event
        self.to = to


def check_move(table: Mapping[tuple[S, E], Collection[S]], record: str, key: str, old: S, event: E, new: S) -> None:
    """Raise :class:`IllegalTransition` unless ``table`` lets ``event`` take a ``record`` from ``old`` to ``new``."""
    if new not in table.get((old, event), ()):
        raise IllegalTransition(record, key, old, event, new)


def check_id(value: str, where: str) -> None:
    if not is_id(value):
        raise Refusal(ErrorCode.INVALID, f"{where}: {value!r} is not a canonical lower-case UUID string")


def check_name(value: str, where: str) -> None:
    if not 1 <= len(value) <= MAX_NAME_CHARS:
        raise Refusal(ErrorCode.INVALID, f"{where}: must hold 1 to {MAX_NAME_CHARS} characters")


def check_limit(limit: int) -> None:
    """Refuse a page ``limit`` outside 1 to :data:`MAX_READ_LIMIT`."""
    if not 1 <= limit <= MAX_READ_LIMIT:
        raise Refusal(ErrorCode.INVALID, f"limit must be between 1 and {MAX_READ_LIMIT}, not {limit}")


def no_conversation(conversation_id: str) -> str:
    return f"conversation {conversation_id} does not exist"


def missing_conversation(conversation_id: str) -> Refusal:
    return Refusal(ErrorCode.NOT_FOUND, no_conversation(conversation_id))


def same_json(left: object, right: object) -> bool:
    """Equality of JSON-like values that also compares types (``1``, ``1.0`` and ``True`` differ)."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        assert isinstance(right, dict)
        return left.keys() == right.keys() and all(same_json(left[key], right[key]) for key in left)
    if isinstance(left, list | tuple):
        assert isinstance(right, list | tuple)
        return len(left) == len(right) and all(same_json(a, b) for a, b in zip(left, right, strict=True))
    return left == right
