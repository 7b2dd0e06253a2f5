"""UUIDv7 ids, minted by whoever creates a record."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid

_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_POOL_IDS = 256


class _RandomPool:
    """Random bytes from the OS, fetched a few kilobytes at a time (one syscall per 256 ids, not one per id).

    A forked child starts a fresh pool, so parent and child never hand out the same bytes.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.data = b""
        self.offset = 0

    def take10(self) -> int:
        if self.offset >= len(self.data):
            self.data = os.urandom(10 * _POOL_IDS)
            self.offset = 0
        start = self.offset
        self.offset = start + 10
        return int.from_bytes(self.data[start : start + 10], "big")


_pool = _RandomPool()
os.register_at_fork(after_in_child=_pool.reset)

_RAND_BITS = 74
"""rand_a (12 bits) and rand_b (62 bits), taken together as one number."""
_STEP_BITS = 32
"""Within one millisecond, each id adds 1 to 2**32 to the last one's random bits: still unguessable, and 2**42 ids
fit a millisecond before the time field has to move on."""


class _Monotonic:
    """The last id's time and random bits in this process, so that its ids strictly increase (RFC 9562, 6.2,
    method 2: monotonic random), even within one millisecond or when the wall clock steps back."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.unix_ms = -1
        self.rand = 0

    def next(self) -> tuple[int, int]:
        unix_ms = time.time_ns() // 1_000_000
        with self.lock:
            if unix_ms > self.unix_ms:
                rand = _pool.take10() >> (80 - _RAND_BITS + 1)  # the top bit stays clear: room to count up
            else:
                unix_ms = self.unix_ms
                rand = self.rand + 1 + (_pool.take10() & ((1 << _STEP_BITS) - 1))
                if rand >> _RAND_BITS:
                    unix_ms += 1
                    rand = _pool.take10() >> (80 - _RAND_BITS + 1)
            self.unix_ms, self.rand = unix_ms, rand
        return unix_ms, rand


_monotonic = _Monotonic()


def new_id() -> str:
    """Return a new UUIDv7 as its canonical 36-character string.

    The first 48 bits are the Unix time in milliseconds, so ids sort by creation time; the ids one process mints
    strictly increase (so the records one client creates sort in the order it created them, as runs do).
    """
    unix_ms, rand = _monotonic.next()
    value = (unix_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= (rand >> 62) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # RFC 9562 variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def is_id(text: object) -> bool:
    """Whether ``text`` is a canonical lower-case UUID string (any version)."""
    return isinstance(text, str) and _CANONICAL.fullmatch(text) is not None


_DERIVED = uuid.UUID("5b0e7c1a-4f7e-4d2b-9a51-2f4d7c9e1b30")


def approval_task_id(operation_id: str) -> str:
    """The id of the ``tether.approval`` task of a tool call's approval: derived from its operation id, so a
    replayed worker waits on the same task (answered already, or not) and never asks twice."""
    return str(uuid.uuid5(_DERIVED, f"{operation_id}/approval"))


def question_task_id(interaction_id: str) -> str:
    """The id of the ``tether.question`` task of a question a tool call asks (``call.ask``): derived from the
    interaction's id, itself derived from the call's operation and the question's place in it, so a replayed handler
    waits on the same task (answered already, or not) and never asks twice."""
    return str(uuid.uuid5(_DERIVED, f"{interaction_id}/question"))
