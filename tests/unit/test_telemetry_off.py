"""Telemetry is off by default at no cost (docs/telemetry.md): a worker and an owner built without it never import
OpenTelemetry; the trace ids a run's spans share are derived from its id alone."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import uuid
from pathlib import Path

import actors
from protocol import root_span_id_of, trace_id_of

REPO = Path(actors.__file__).parent.parent

OFF = """
import sys, trio
import actors, runtime
from actors._worker._serve import _telemetry
from storage_owner.io import OwnerConfig, OwnerServer
from storage_owner.core import OwnerCore
assert _telemetry(None, None) is None
server = OwnerServer(OwnerConfig(db=sys.argv[1]))
assert server._telemetry is None
runtime.build_parser().parse_args(["owner", "--db", sys.argv[1]])
print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
"""


def test_an_owner_and_a_worker_without_telemetry_import_no_opentelemetry(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "TETHER_OTEL"}
    result = subprocess.run(
        [sys.executable, "-c", OFF, str(tmp_path / "t.db")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert ast.literal_eval(result.stdout.strip()) == []


def test_tether_otel_in_the_environment_turns_it_on(tmp_path: Path) -> None:
    code = OFF.replace("assert _telemetry(None, None) is None", "assert _telemetry(None, None) is not None")
    code = code.replace("assert server._telemetry is None", "assert server._telemetry is not None")
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "t.db")],
        cwd=REPO,
        env={**os.environ, "TETHER_OTEL": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "opentelemetry.trace" in ast.literal_eval(result.stdout.strip())


def test_a_runs_trace_id_is_its_id_and_its_root_span_id_is_derived() -> None:
    run_id = "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b"
    assert trace_id_of(run_id) == uuid.UUID(run_id).int
    assert root_span_id_of(run_id) == root_span_id_of(run_id) != root_span_id_of("0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2c")
    assert 0 < root_span_id_of(run_id) < 1 << 64
    other = trace_id_of("not a uuid")  # a task id of another shape still gets a 128-bit id, never 0
    assert 0 < other < 1 << 128 and other == trace_id_of("not a uuid")
