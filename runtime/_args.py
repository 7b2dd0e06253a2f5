"""The command line's number types, shared by every ``tether`` command: each refuses what it does not take with an
``argparse`` error naming what was given (exit 2, nothing done)."""

from __future__ import annotations

import argparse
import math


def whole_number(text: str, *, minimum: int = 0) -> int:
    """A whole number of ``minimum`` or more, written in ASCII digits (not ``²``, ``-1``, ``1.0`` nor ``1e3``)."""
    if not (text.isascii() and text.isdigit()) or int(text) < minimum:
        raise argparse.ArgumentTypeError(f"expected a whole number of {minimum} or more, not {text!r}")
    return int(text)


def count(text: str) -> int:
    """A whole number of 0 or more."""
    return whole_number(text)


def positive(text: str) -> int:
    """A whole number of 1 or more."""
    return whole_number(text, minimum=1)


def amount(text: str) -> float:
    """A finite number of 0 or more (a price, a cost)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a number of 0 or more, not {text!r}")
    return value
