"""SIGINT and SIGTERM caught from the first moment of a ``tether`` process, remembered, and acted on later.

Python takes most of half a second to import what a command needs, and a signal in that time would act by its
default, killing ``tether owner`` or ``tether worker`` instead of stopping it cleanly. So the entry point
(``runtime._entry``) first installs a handler that only remembers the signal (:func:`install_early_handlers`), and
unblocks the two signals (Tether starts its children with them blocked until this point: see
:func:`runtime.open_tether_process`); only then does it import the command line. A command that listens for the
signals itself (trio's receiver, in ``tether owner``, ``worker`` and ``up``) calls :func:`replay_early_signals` once
its receiver is in place: a signal remembered meanwhile then stops it as if it came at that moment. Every other
command gets the default handlers back as soon as it is known (:func:`restore_default_signals`), and a remembered
signal then acts as it would have.

This module imports nothing but :mod:`signal` (not even :mod:`typing`, a few milliseconds): it runs before
everything else.
"""

from __future__ import annotations

import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_remembered: list[int] = []
_replaced: dict[int, Any] = {}
"""The handlers the early ones replaced (to give back), while they are in place."""


def _remember(signum: int, frame: FrameType | None) -> None:
    _remembered.append(signum)


def install_early_handlers() -> None:
    """Remember SIGINT and SIGTERM from now on, and unblock them (a blocked one sent meanwhile arrives now)."""
    for sig in STOP_SIGNALS:
        _replaced[sig] = signal.signal(sig, _remember)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def replay_early_signals() -> None:
    """Send this process again each signal remembered since :func:`install_early_handlers` (once each): call it once
    the process's own handlers are in place. Nothing happens when none was remembered (or none was installed)."""
    remembered = list(dict.fromkeys(_remembered))
    _remembered.clear()
    for sig in remembered:
        signal.raise_signal(sig)


def restore_default_signals() -> None:
    """Give the handlers the early ones replaced back, then act on what was remembered: for a command that does not
    listen for SIGINT or SIGTERM itself."""
    for sig, handler in _replaced.items():
        signal.signal(sig, handler)
    _replaced.clear()
    replay_early_signals()
