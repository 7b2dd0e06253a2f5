"""How an amount (a cost, a price, a budget's ``max_cost``) is written for a person, defined once for the owner's
messages and the command line's tables."""

from __future__ import annotations

from decimal import Decimal
from typing import Final

AMOUNT_DIGITS: Final = 10
"""Significant digits an amount is written with: enough for any price times any token count, few enough that a sum
of floats (0.1 + 0.2) reads 0.3."""


def amount_text(amount: float) -> str:
    """``amount`` as a plain decimal, never in exponent notation: ``0.00001``, ``1.5``, ``123456.75``; rounded to
    :data:`AMOUNT_DIGITS` significant digits, trailing zeros dropped."""
    return format(Decimal(f"{amount:.{AMOUNT_DIGITS}g}"), "f")
