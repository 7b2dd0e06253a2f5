"""The owner's telemetry object (``storage_owner.io._telemetry``) on the SDK's in-memory reader and exporter: what a
committed batch adds, the span of an ended run (the root of its trace, with the derived ids; a retried run's end a
child of it), the gauges it reads, and a failure that never reaches the commit loop."""

from __future__ import annotations

from typing import Any

import attrs
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from protocol import RunRecord, RunUsage, root_span_id_of, trace_id_of
from storage_owner.core import CoreGauges, run_task_id
from storage_owner.io._telemetry import OwnerTelemetry

RUN_ID = "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b"
GAUGES = CoreGauges(
    runs_by_status={"running": 2, "waiting": 1},
    ready_tasks=3,
    blocked_tasks=1,
    leased_tasks=2,
    workers=1,
    usage={("model", "gpt"): RunUsage(input_tokens=10, output_tokens=4, cost=0.5)},
)


def _run(**changes: Any) -> RunRecord:
    run = RunRecord(
        run_id=RUN_ID,
        conversation_id="c",
        agent="support",
        version=1,
        status="completed",
        submission_id=RUN_ID,
        task_id=run_task_id(RUN_ID, 1),
        usage=RunUsage(input_tokens=10, output_tokens=4),
        seq=9,
        created_at_ms=1_000,
        updated_at_ms=3_500,
    )
    return attrs.evolve(run, **changes)


def _telemetry() -> tuple[OwnerTelemetry, InMemorySpanExporter, InMemoryMetricReader, list[str]]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    lines: list[str] = []
    telemetry = OwnerTelemetry(
        lambda: (GAUGES, 5, 1024, 2),
        log=lines.append,
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    return telemetry, exporter, reader, lines


def _points(reader: InMemoryMetricReader) -> dict[str, dict[tuple[tuple[str, Any], ...], Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, dict[tuple[tuple[str, Any], ...], Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = {
                    tuple(sorted((point.attributes or {}).items())): getattr(point, "value", None) or point
                    for point in metric.data.data_points
                }
    return found


async def test_batches_count_commits_transactions_sizes_and_ended_runs() -> None:
    telemetry, exporter, reader, _ = _telemetry()
    telemetry.start(head_seq=100)
    telemetry.batch(frames=7, head_seq=104, wrote=True, ended_runs=())
    telemetry.batch(frames=1, head_seq=104, wrote=False, ended_runs=())
    telemetry.batch(frames=2, head_seq=105, wrote=True, ended_runs=(_run(),))
    points = _points(reader)
    assert points["tether.owner.commits"] == {(): 5}
    assert points["tether.owner.transactions"] == {(): 2}
    (histogram,) = points["tether.owner.batch.size"].values()
    assert (histogram.count, histogram.sum) == (3, 10)
    assert points["tether.runs.ended"] == {(("tether.run.status", "completed"),): 1}
    # The gauges, read from the trio thread at once.
    assert points["tether.runs"] == {(("tether.run.status", "running"),): 2, (("tether.run.status", "waiting"),): 1}
    assert points["tether.owner.queue.depth"][(("tether.queue", "pending_frames"),)] == 5
    assert points["tether.owner.queue.depth"][(("tether.queue", "ready_tasks"),)] == 3
    assert points["tether.owner.output.queued"] == {(): 1024}
    tokens = points["tether.usage.tokens"]
    key = (("gen_ai.token.type", "input"), ("tether.usage.kind", "model"), ("tether.usage.name", "gpt"))
    assert tokens[key] == 10
    assert points["tether.usage.cost"] == {(("tether.usage.kind", "model"), ("tether.usage.name", "gpt")): 0.5}
    (span,) = exporter.get_finished_spans()
    assert span.name == "tether.run" and span.parent is None
    assert (span.context.trace_id, span.context.span_id) == (trace_id_of(RUN_ID), root_span_id_of(RUN_ID))
    assert (span.start_time, span.end_time) == (1_000 * 1_000_000, 3_500 * 1_000_000)


async def test_a_retried_runs_end_is_a_child_of_its_root_and_other_spans_keep_random_ids() -> None:
    telemetry, exporter, _, _ = _telemetry()
    telemetry.start(head_seq=0)
    telemetry.batch(frames=1, head_seq=1, wrote=True, ended_runs=(_run(task_id=run_task_id(RUN_ID, 2)),))
    (span,) = exporter.get_finished_spans()
    assert span.context.trace_id == trace_id_of(RUN_ID)
    assert span.parent is not None and span.parent.span_id == root_span_id_of(RUN_ID)
    assert span.context.span_id != root_span_id_of(RUN_ID)


async def test_a_telemetry_failure_is_logged_once_and_never_raised() -> None:
    telemetry, _, _, lines = _telemetry()
    telemetry.start(head_seq=0)
    broken = _run(usage=None)  # type: ignore[arg-type]  # a bug's shape: reading its usage raises
    telemetry.batch(frames=1, head_seq=1, wrote=True, ended_runs=(broken,))
    telemetry.batch(frames=1, head_seq=2, wrote=True, ended_runs=(broken,))
    assert len(lines) == 1 and "telemetry failed" in lines[0]
