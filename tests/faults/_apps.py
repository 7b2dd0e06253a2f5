"""Test applications for ``tether up`` / ``tether worker`` process tests, importable as ``tests.faults._apps:...``.

``app`` defines one task kind, so that what a supervised worker announces (and re-announces after reconnecting)
can be checked through ``client.peers()``. ``not_an_app`` is importable but is not an :class:`actors.App`.
The app that fails at import lives in ``tests.faults._crashing_app``.
"""

from __future__ import annotations

from typing import Any

import actors

TASK_KIND = "faults.noop"
TASK_VERSION = 2


async def _run(state: Any) -> None:
    return None


app = actors.App("faults")
app.define_task(TASK_KIND, version=TASK_VERSION, initial=lambda payload: {}, phases={"run": _run})

not_an_app = {"name": "faults"}
