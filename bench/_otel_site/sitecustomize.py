"""``bench/steps.py --otel`` only: puts this folder on the owner's and the worker's ``PYTHONPATH`` (with
``TETHER_OTEL=1``), so that Python runs this at start-up and both trace and measure on SDK providers whose exporters
drop what they get: spans through a ``BatchSpanProcessor`` (the usual production setup: ended spans are queued, then
exported on a thread of the SDK's), metrics collected every second (the callbacks of the owner's observable
instruments run then). What is measured is the cost of making the telemetry, not of shipping it anywhere."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, PeriodicExportingMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class _DropSpans(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _DropMetrics(MetricExporter):
    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


_tracer_provider = TracerProvider()
_tracer_provider.add_span_processor(BatchSpanProcessor(_DropSpans()))
trace.set_tracer_provider(_tracer_provider)
metrics.set_meter_provider(
    MeterProvider(metric_readers=[PeriodicExportingMetricReader(_DropMetrics(), export_interval_millis=1000)])
)
