"""OpenTelemetry (``tether[otel]``, docs/telemetry.md): an agent's run with a tool call, traced and measured by an owner
and a worker in this process, on the SDK's in-memory span exporter and metric reader: one trace per run, its root the
owner's ``tether.run`` span, the worker's phases under it, the model requests (GenAI attributes) and the tool call
under their phases; the owner's counters, histogram and gauges."""

from __future__ import annotations

import uuid
from typing import Any

import trio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import actors
from actors._models._model import Usage
from protocol import new_id, root_span_id_of, trace_id_of
from storage_owner.io import OwnerConfig, OwnerServer

SCRIPT = [
    actors.ScriptedTurn(tool_calls=[("lookup", {"order_id": "A1"})], usage=Usage(input_tokens=120, output_tokens=7)),
    actors.ScriptedTurn(text="Your order shipped.", usage=Usage(input_tokens=150, output_tokens=5)),
]


async def lookup(call: actors.ToolCall, args: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": args["order_id"], "status": "shipped"}


def _app() -> actors.App:
    app = actors.App("traced")
    app.define_tool("lookup", lookup, description="Look an order up.", parameters={"type": "object"}, recovery="safe")
    app.define_agent("support", version=1, model=actors.ScriptedModel(SCRIPT), tools=["lookup"])
    return app


def _metrics(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = list(metric.data.data_points)
    return found


def _value(points: list[Any], **attributes: Any) -> Any:
    matching = [point.value for point in points if all(point.attributes.get(k) == v for k, v in attributes.items())]
    assert len(matching) == 1, (attributes, points)
    return matching[0]


async def test_a_run_is_one_trace_across_the_owner_and_its_worker_with_metrics(db_path: str) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    server = OwnerServer(OwnerConfig(db=db_path), tracer_provider=tracer_provider, meter_provider=meter_provider)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(server.run)
            async with actors.connect(url=url, token=server.token) as client:
                worker = trio.CancelScope()

                async def serve(*, task_status: trio.TaskStatus[Any]) -> None:
                    with worker:
                        await actors.serve(
                            _app(),
                            url=url,
                            token=server.token,
                            handle_signals=False,
                            tracer_provider=tracer_provider,
                            task_status=task_status,
                        )

                await nursery.start(serve)
                conversation_id = await client.create_conversation(agent="support")
                submission = await client.submit(conversation_id, kind="input", payload="Where?", request_id=new_id())
                run_id = submission.run_id
                assert run_id is not None
                run = await client.wait_for_run(run_id)
                assert run.status == "completed"
                await client.conversation(conversation_id)  # one more batch: the run's end is counted by now
                metrics = _metrics(reader)
                worker.cancel()
            nursery.cancel_scope.cancel()

    spans: tuple[ReadableSpan, ...] = exporter.get_finished_spans()
    trace_id = trace_id_of(run_id)
    assert trace_id == uuid.UUID(run_id).int  # the trace of a run is its id
    assert {span.context.trace_id for span in spans} == {trace_id}
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)

    # The owner's root span, with the id every worker span names as its parent.
    (root,) = by_name["tether.run"]
    assert root.parent is None
    assert root.context.span_id == root_span_id_of(run_id)
    assert root.attributes is not None
    assert root.attributes["tether.run.status"] == "completed"
    assert root.attributes["gen_ai.usage.input_tokens"] == 270
    assert root.attributes["gen_ai.usage.output_tokens"] == 12

    # Phases: the run's task runs `turn` (its tool call's task waited on), then `tools` (and the next turn in the same
    # run of the phase), the tool call's task `call`; each a child of the root.
    phases = {(s.attributes["tether.task.kind"], s.attributes["tether.phase"]): s for s in by_name["tether.phase"]}  # type: ignore[index]
    assert set(phases) == {("agent:support", "turn"), ("agent:support", "tools"), ("tool:lookup", "call")}
    for span in phases.values():
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert span.attributes is not None and span.attributes["tether.run.id"] == run_id
    outcomes = {key: span.attributes["tether.phase.outcome"] for key, span in phases.items()}  # type: ignore[index]
    assert outcomes == {
        ("agent:support", "turn"): "waiting",
        ("agent:support", "tools"): "completed",
        ("tool:lookup", "call"): "completed",
    }

    # Model requests: GenAI attributes, each a child of the phase that made it.
    chats = sorted(by_name["chat scripted"], key=lambda s: s.attributes["tether.turn"])  # type: ignore[index]
    assert [chat.parent.span_id for chat in chats] == [  # type: ignore[union-attr]
        phases["agent:support", "turn"].context.span_id,
        phases["agent:support", "tools"].context.span_id,
    ]
    first, second = (dict(chat.attributes or {}) for chat in chats)
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.request.model"] == "scripted"
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (120, 7)
    assert first["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert (second["gen_ai.usage.input_tokens"], second["gen_ai.usage.output_tokens"]) == (150, 5)
    assert second["gen_ai.response.finish_reasons"] == ("stop",)

    # The tool call: a child of its task's phase.
    (tool,) = by_name["execute_tool lookup"]
    assert tool.parent is not None and tool.parent.span_id == phases["tool:lookup", "call"].context.span_id
    attributes = dict(tool.attributes or {})
    assert attributes["gen_ai.tool.name"] == "lookup"
    assert attributes["tether.tool.policy"] == "safe"
    assert attributes["tether.attempt"] == 1
    assert attributes["tether.tool.outcome"] == "completed"
    assert attributes["tether.tool.is_error"] is False

    # The owner's metrics.
    assert sum(point.value for point in metrics["tether.owner.commits"]) >= 6  # submit, intents, results, settles
    assert sum(point.value for point in metrics["tether.owner.transactions"]) >= 3
    assert sum(point.count for point in metrics["tether.owner.batch.size"]) >= 3
    assert _value(metrics["tether.runs.ended"], **{"tether.run.status": "completed"}) == 1
    tokens = metrics["tether.usage.tokens"]
    assert _value(tokens, **{"tether.usage.name": "scripted", "gen_ai.token.type": "input"}) == 270
    assert _value(tokens, **{"tether.usage.name": "scripted", "gen_ai.token.type": "output"}) == 12
    assert metrics.get("tether.runs", []) == []  # no live run left
    assert _value(metrics["tether.owner.queue.depth"], **{"tether.queue": "ready_tasks"}) == 0
    assert _value(metrics["tether.owner.peers"], **{"tether.peer.role": "worker"}) == 1
