"""The owner's clocks. The core never reads a clock: the shell hands it ``now_ms`` with every batch."""

from __future__ import annotations

import math
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def advance_to(self, now_ms: int) -> None: ...

    def seconds_until(self, deadline_ms: int) -> float:
        """How long to wait in real time for this clock to reach ``deadline_ms`` by itself."""
        ...


class WallClock:
    """Unix time in milliseconds that never goes backwards within one owner."""

    def __init__(self) -> None:
        self._last_ms = 0

    def now_ms(self) -> int:
        self._last_ms = max(self._last_ms, time.time_ns() // 1_000_000)
        return self._last_ms

    def advance_to(self, now_ms: int) -> None:
        raise AssertionError("the wall clock cannot be advanced")

    def seconds_until(self, deadline_ms: int) -> float:
        return max(0.0, (deadline_ms - self.now_ms()) / 1000)


class ManualClock:
    """A clock that moves only when a client asks it to (``AdvanceClock``); its time is stored in the database."""

    def __init__(self, start_ms: int) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance_to(self, now_ms: int) -> None:
        self._now_ms = max(self._now_ms, now_ms)

    def seconds_until(self, deadline_ms: int) -> float:
        return 0.0 if deadline_ms <= self._now_ms else math.inf
