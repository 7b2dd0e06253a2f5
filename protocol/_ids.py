"""UUIDv7 ids, minted by whoever creates a record."""

from __future__ import annotations

import os
import re
import time
import uuid

_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def new_id() -> str:
    """Return a new UUIDv7 as its canonical 36-character string.

    The first 48 bits are the Unix time in milliseconds, so ids sort roughly by creation time.
    """
    unix_ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (unix_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # RFC 9562 variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    return str(uuid.UUID(int=value))


def is_id(text: object) -> bool:
    """Whether ``text`` is a canonical lower-case UUID string (any version)."""
    return isinstance(text, str) and _CANONICAL.fullmatch(text) is not None
