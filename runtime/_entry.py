"""The ``tether`` command's entry point (the console script, ``python -m runtime``): SIGINT and SIGTERM are caught
before anything heavy is imported (``runtime._signals``), then the command line is imported and run.

This module and ``runtime._signals`` import nothing but :mod:`signal`: they run before everything else. It is the
one module that imports the command line (``runtime._cli``); the command line imports the rest of ``runtime``, and
nothing imports it back (tests/unit/test_layers.py holds that).
"""

from __future__ import annotations

from ._signals import install_early_handlers

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """``tether ARGS``: the early handlers, then the command line (:func:`runtime._cli.main`)."""
    install_early_handlers()
    from ._cli import main as run_command

    return run_command(argv)
