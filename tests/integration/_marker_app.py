"""A test application that records each import: ``--app tests.integration._marker_app:app``.

Every process that imports it appends a line to the file named by ``TETHER_TEST_IMPORTS`` (when set), its pid and
``worker`` or, for ``tether up``'s check of the app before it starts workers, ``check``: so a test can tell whether
``tether up`` started any worker at all.
"""

from __future__ import annotations

import os
import sys

import actors

_IMPORTS = os.environ.get("TETHER_TEST_IMPORTS")
if _IMPORTS:
    with open(_IMPORTS, "a", encoding="ascii") as _stream:
        _stream.write(f"{os.getpid()} {'check' if '--check-app' in sys.argv else 'worker'}\n")

app = actors.App("marker")
