"""A test application that records each import: ``--app tests.integration._marker_app:app``.

Every process that imports it appends its pid to the file named by ``TETHER_TEST_IMPORTS`` (when set), so a test
can tell whether ``tether up`` started any worker at all.
"""

from __future__ import annotations

import os

import actors

_IMPORTS = os.environ.get("TETHER_TEST_IMPORTS")
if _IMPORTS:
    with open(_IMPORTS, "a", encoding="ascii") as _stream:
        _stream.write(f"{os.getpid()}\n")

app = actors.App("marker")
