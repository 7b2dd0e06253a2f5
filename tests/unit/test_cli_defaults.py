"""The command line keeps copies of the libraries' defaults (it imports neither the owner nor the client at start,
to start fast); each copy must equal what it copies."""

from __future__ import annotations

import runtime._cli_owner_options as cli
import runtime._cli_worker as worker_cli
from actors._worker._serve import DEFAULT_DRAIN_TIMEOUT_S, DEFAULT_MANUAL_GRACE_S
from storage_owner.core import DEFAULT_PEER_OUTPUT_BYTES, DEFAULT_TOTAL_OUTPUT_BYTES, MODEL_GRACE_MS
from storage_owner.io._listener import DEFAULT_HANDSHAKE_TIMEOUT_S, DEFAULT_MAX_UNAUTHENTICATED

MIB = 1024 * 1024


def test_the_command_lines_defaults_are_the_libraries() -> None:
    assert worker_cli.DEFAULT_DRAIN_TIMEOUT_S == DEFAULT_DRAIN_TIMEOUT_S
    assert worker_cli.DEFAULT_MANUAL_GRACE_S == DEFAULT_MANUAL_GRACE_S
    assert cli.DEFAULT_MODEL_GRACE_S * 1000 == MODEL_GRACE_MS
    assert cli.DEFAULT_HANDSHAKE_TIMEOUT_S == DEFAULT_HANDSHAKE_TIMEOUT_S
    assert cli.DEFAULT_MAX_UNAUTHENTICATED == DEFAULT_MAX_UNAUTHENTICATED
    assert cli.DEFAULT_MAX_PEER_OUTPUT_MIB * MIB == DEFAULT_PEER_OUTPUT_BYTES
    assert cli.DEFAULT_MAX_QUEUED_OUTPUT_MIB * MIB == DEFAULT_TOTAL_OUTPUT_BYTES
