"""The command line's argument types and common options, shared by every ``tether`` command: each type refuses what
it does not take with an ``argparse`` error naming what was given (exit 2, nothing done)."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from protocol import is_id


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


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets) as ``(host, port)``."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (such as 127.0.0.1:0), not {text!r}")
    return host.strip("[]"), int(port)


def seconds(text: str) -> float:
    """A number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, not {text!r}")
    return value


def seconds_or_zero(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, 0 or more, not {text!r}")
    return value


def json_text(text: str) -> Any:
    """A JSON value."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected a JSON value (such as '{{\"ok\": true}}'), not {text!r}: {exc}"
        ) from None


def add_db(command: argparse.ArgumentParser) -> None:
    """The ``--db`` option of a command that reaches a database's owner (default ``./tether.db``)."""
    command.add_argument("--db", default="tether.db", help="the database (default ./tether.db)")


def add_json(command: argparse.ArgumentParser, what: str) -> None:
    """The ``--json`` flag of a command that prints records; ``what`` says what the JSON holds."""
    command.add_argument("--json", action="store_true", help=what)


def identifier(text: str) -> str:
    """An id of Tether's (a run's, a conversation's, a submission's, an operation's...): a canonical lower-case
    UUID. Every command refuses a malformed one the same way, before asking the owner (which would say it does not
    exist, or name a field of its request)."""
    if not is_id(text):
        raise argparse.ArgumentTypeError(
            f"expected an id (a lower-case UUID, such as 0190f3a2-7c4e-7b1a-9d3e-5f6a7b8c9d0e), not {text!r}"
        )
    return text
