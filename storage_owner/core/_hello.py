"""The bounds on a ``hello``'s strings, checked before anything else is done with them.

A hello is read from a connection that has not proved anything yet, and its strings are kept (``peer_name`` is
shown by ``read_peers`` and ``tether status`` for as long as the peer stays attached) or echoed in the refusal
(``role``). Each has a bound; the first one passed is named in the refusal, and nothing is attached.
"""

from __future__ import annotations

from typing import Final

from protocol import MAX_PEER_NAME_CHARS, MAX_ROLE_CHARS, MAX_TOKEN_CHARS, Hello

HELLO_STRING_BOUNDS: Final = (
    ("token", MAX_TOKEN_CHARS, False),
    ("role", MAX_ROLE_CHARS, True),
    ("peer_name", MAX_PEER_NAME_CHARS, True),
)
"""Each of the hello's string fields: its name, its most characters, whether it must be printable."""


def hello_problem(hello: Hello) -> str | None:
    """What is wrong with ``hello``'s strings, naming the field, or ``None`` when every one is within its bound."""
    for field, most, printable in HELLO_STRING_BOUNDS:
        value: str = getattr(hello, field)
        if len(value) > most:
            return f"the hello's {field} is {len(value)} characters long, over the limit of {most}"
        if printable and not value.isprintable():
            return f"the hello's {field} holds a character that is not printable (a control or format character)"
    return None
