"""Tether's runtime: the ``tether`` command line, the supervisor (``tether up``) and process spawning.

Importing this package is cheap (the names below are loaded on first use), so that the ``tether`` entry point runs
before the command line's imports: see ``runtime._entry``.
"""

from __future__ import annotations

from importlib import import_module

from ._entry import main

TYPE_CHECKING = False  # not typing's: importing typing would cost the entry point a few milliseconds
if TYPE_CHECKING:
    from ._cli import build_parser
    from ._process import (
        kill_and_reap,
        open_tether_process,
        start_owner,
        stop_gracefully,
        tether_command,
        wait_for_owner,
    )

__all__ = [
    "build_parser",
    "kill_and_reap",
    "main",
    "open_tether_process",
    "start_owner",
    "stop_gracefully",
    "tether_command",
    "wait_for_owner",
]

_LAZY = {
    "build_parser": "._cli",
    "kill_and_reap": "._process",
    "open_tether_process": "._process",
    "start_owner": "._process",
    "stop_gracefully": "._process",
    "tether_command": "._process",
    "wait_for_owner": "._process",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)
