"""Restart limits: how many cut-off phases in a row end a task (docs/agents.md, "Recovery policies"), given per tool
(``define_tool(restart_limit=)``), per agent for its runs' tasks (``define_agent(restart_limit=)``), per task kind
(``define_task(restart_limit=)``), or app-wide (``actors.App(name, restart_limit=)``) for every definition that gives
none; ``None`` is no limit. A definition keeps what it was given (:data:`FROM_APP` when nothing), and the app resolves
it when it announces (:meth:`actors.App.capabilities`), so an app-wide setting that changes reaches the next
announcement.
"""

from __future__ import annotations

import enum
from typing import Final, Literal, TypeAlias

from protocol import MAX_RESTART_LIMIT, UsageError

DEFAULT_RESTART_LIMIT: Final = 5
"""The app-wide restart limit unless ``actors.App(name, restart_limit=...)`` says otherwise."""


class _FromApp(enum.Enum):
    FROM_APP = "the app's"


FROM_APP: Final = _FromApp.FROM_APP
"""A definition's ``restart_limit`` when it gives none: the app's (``actors.App(name, restart_limit=...)``)."""
RestartLimit: TypeAlias = int | None
"""A restart limit: cut-off phases in a row, 1 to :data:`~protocol.MAX_RESTART_LIMIT`; ``None``: no limit."""
GivenRestartLimit: TypeAlias = int | Literal[_FromApp.FROM_APP] | None
"""What a definition was given: a :data:`RestartLimit`, or :data:`FROM_APP`."""


def checked_limit(value: object, what: str) -> RestartLimit:
    """``value`` once it is a restart limit; :class:`UsageError` naming ``what`` otherwise."""
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= MAX_RESTART_LIMIT:
        raise UsageError(
            f"{what}: restart_limit is a whole number of cut-off phases from 1 to {MAX_RESTART_LIMIT}, or None for no "
            f"limit, not {value!r}"
        )
    return value


def checked_restart_limit(value: object, what: str) -> GivenRestartLimit:
    """What a definition was given, once it is a restart limit or :data:`FROM_APP`."""
    return FROM_APP if value is FROM_APP else checked_limit(value, what)


def resolved(given: GivenRestartLimit, app_limit: RestartLimit) -> RestartLimit:
    """The limit a definition announces: its own, else the app's."""
    return app_limit if given is FROM_APP else given
