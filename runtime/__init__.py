"""Tether's runtime: the ``tether`` command line, the supervisor (``tether up``) and process spawning."""

from ._cli import build_parser, main
from ._process import kill_and_reap, start_owner, stop_gracefully, tether_command, wait_for_owner

__all__ = [
    "build_parser",
    "kill_and_reap",
    "main",
    "start_owner",
    "stop_gracefully",
    "tether_command",
    "wait_for_owner",
]
