"""Apps for tests/faults/test_testing_kit.py, importable as ``tests.faults._kit_apps:ATTR`` by a ``tether worker``:
an agent ``support`` that calls ``lookup`` once (each execution a line in ``TETHER_TEST_LEDGER``), then answers."""

from __future__ import annotations

from tests.integration._agent_apps import ONE_CALL, build

safe = build(ONE_CALL, recovery="safe")
