"""``actors.Retry``: how a model request that failed with a retryable error is tried again, and the back-off it waits.

The delay is :func:`protocol.retry_delay_ms`, the one formula the owner uses too (it computes the same deadline for
an interrupted request).
"""

from __future__ import annotations

import math
from typing import Any, Final

import attrs

import protocol
from protocol import UsageError


def _at_least(minimum: float) -> Any:
    def check(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= minimum:
            raise UsageError(f"Retry.{attribute.name} must be a number of {minimum} or more, not {value!r}")

    return check


@attrs.frozen(kw_only=True)
class Retry:
    """How a model request that failed with a retryable error is tried again: at most ``attempts`` attempts in
    all, waiting ``first_delay_ms`` after the first failure and ``multiplier`` times longer after each next one, at
    most ``max_delay_ms``.

    Deterministic, without jitter: the delay becomes a durable deadline on the owner's clock, and tests and replays
    must see the same one. (A jitter derived from the operation id could be added without losing that.)
    """

    attempts: int = attrs.field(default=4, validator=_at_least(1))
    first_delay_ms: int = attrs.field(default=500, validator=_at_least(0))
    max_delay_ms: int = attrs.field(default=30_000, validator=_at_least(0))
    multiplier: float = attrs.field(default=2.0, validator=_at_least(1.0))

    def __attrs_post_init__(self) -> None:
        for name in ("attempts", "first_delay_ms", "max_delay_ms"):
            if type(getattr(self, name)) is not int:
                raise UsageError(f"Retry.{name} must be a whole number, not {getattr(self, name)!r}")
        if not math.isfinite(self.multiplier):
            raise UsageError(f"Retry.multiplier must be finite, not {self.multiplier!r}")
        if self.max_delay_ms < self.first_delay_ms:
            raise UsageError(
                f"Retry.max_delay_ms ({self.max_delay_ms}) is below first_delay_ms ({self.first_delay_ms})"
            )

    def delay_ms(self, attempt: int, retry_after_ms: int | None = None) -> int | None:
        """How long to wait after attempt ``attempt`` (1-based) failed before the next one, or ``None`` when that
        was the last attempt. A provider's ``retry_after_ms`` is a floor, capped at ``max_delay_ms`` like the rest.
        The delay is :func:`protocol.retry_delay_ms`, the one formula the owner uses too (see :func:`backoff_ms`).
        """
        if type(attempt) is not int or attempt < 1:
            raise UsageError(f"attempts count from 1, not {attempt!r}")
        if retry_after_ms is not None and retry_after_ms < 0:
            raise UsageError(f"retry_after_ms cannot be negative ({retry_after_ms})")
        return next_delay_ms(self.to_protocol(), attempt, retry_after_ms)

    def to_protocol(self) -> protocol.Retry:
        """The policy as a model request's intent stores it (:class:`protocol.Retry`, the same fields)."""
        return protocol.Retry(
            attempts=self.attempts,
            first_delay_ms=self.first_delay_ms,
            max_delay_ms=self.max_delay_ms,
            multiplier=self.multiplier,
        )


def backoff_ms(retry: protocol.Retry, attempt: int, retry_after_ms: int | None = None) -> int:
    """The delay after failed attempt ``attempt``: :func:`protocol.retry_delay_ms` (shared with the owner, which
    computes the same deadline for an interrupted request), with a provider's ``retry_after_ms`` as a floor, capped
    at ``max_delay_ms``."""
    try:
        delay = protocol.retry_delay_ms(retry, attempt)
    except OverflowError:
        delay = retry.max_delay_ms
    if retry_after_ms is not None:
        delay = max(delay, min(retry_after_ms, retry.max_delay_ms))
    return delay


def next_delay_ms(retry: protocol.Retry, attempt: int, retry_after_ms: int | None = None) -> int | None:
    """How long to wait after failed attempt ``attempt`` before the next one (:func:`backoff_ms`), or ``None`` when
    ``attempt`` was the policy's last: then nothing is retried, and the failure is final. The one place that knows
    the last attempt, for :meth:`Retry.delay_ms` and the run loop (which holds the policy the journal stored)."""
    if attempt >= retry.attempts:
        return None
    return backoff_ms(retry, attempt, retry_after_ms)


DEFAULT_RETRY: Final = Retry()
