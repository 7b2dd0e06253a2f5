"""A test application that fails every time it is imported: ``--app tests.faults._crashing_app:app``.

``tether up`` restarts its workers until the restart intensity is exceeded, then gives up naming a worker and
quoting this error.
"""

from __future__ import annotations

raise RuntimeError("boom at import")
