"""A test application that fails every time it is imported: ``--app tests.faults._crashing_app:app``.

``tether up`` loads it once before starting any worker (``tether worker --check-app``), and stops at once with exit
status 2, quoting this error.
"""

from __future__ import annotations

raise RuntimeError("boom at import")
