"""Limits the owner enforces and its peers respect, defined once for both sides."""

from __future__ import annotations

from typing import Final

MAX_LEASES_PER_WORKER: Final = 100_000
"""The owner's limit on a worker's ``max_leases`` (an ``announce`` over it is refused as ``invalid``)."""
DEFAULT_MAX_LEASES: Final = 64
"""Phases a worker runs at once unless told otherwise (``actors.serve``, ``tether worker``)."""
