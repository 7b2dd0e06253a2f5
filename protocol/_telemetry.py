"""What the owner and its workers share of OpenTelemetry (``tether[otel]``), without importing it: whether it is on by
default (``TETHER_OTEL``), and the ids that link a run's spans across processes.

**Linked without context on the wire.** Every span of a run (the owner's ``tether.run``, each worker's phases, model
requests and tool calls) is in the trace whose id is the run's id (a UUID's 128 bits: the trace of run
``0190...-...`` is ``0190...``, so a run id found in a log finds its trace), under the root span whose id derives
from it. A worker starts its spans as children of that root (a remote parent it derives, never sent); the owner emits
the root once the run ends. No frame carries a ``traceparent``: a phase re-run by another worker after a crash, or a
tool call run by a worker that never saw the run's model turn, derives the same ids, and no protocol change was
needed. A task that belongs to no run gets the same from its own id (its phases share a trace; nothing emits its
root).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import Final

OTEL_ENVIRONMENT: Final = "TETHER_OTEL"
"""``TETHER_OTEL=1``: the owner and workers started in this environment trace and measure with the global OpenTelemetry
providers (as ``tether owner --otel`` / ``tether worker --otel`` do); ``tether up`` passes it to its children."""


def otel_from_environment() -> bool:
    """Whether ``TETHER_OTEL`` asks for telemetry (``1``, ``true``, ``yes``, ``on``; anything else, or unset: off)."""
    return os.environ.get(OTEL_ENVIRONMENT, "").strip().lower() in ("1", "true", "yes", "on")


def trace_id_of(key: str) -> int:
    """The trace id (128 bits, never 0) of the run (or task) ``key``: its UUID's bits, else a digest of it."""
    try:
        value = uuid.UUID(key).int
    except ValueError:
        value = 0
    if value == 0:
        value = int.from_bytes(hashlib.sha256(b"tether.trace/" + key.encode()).digest()[:16], "big") or 1
    return value


def root_span_id_of(key: str) -> int:
    """The span id (64 bits, never 0) of the root span of ``key``'s trace: the parent every worker span of a run
    names, and the id of the ``tether.run`` span the owner emits when the run ends."""
    return int.from_bytes(hashlib.sha256(b"tether.root/" + key.encode()).digest()[:8], "big") or 1
