"""The owner's telemetry (``tether[otel]``): its metrics, and the ``tether.run`` span of each run once it ends.
Imported only when telemetry is on (``OwnerServer(otel=True)``, ``TETHER_OTEL=1``, ``tether owner --otel``): an owner
without it never loads OpenTelemetry, and its commit loop pays one attribute check per batch.

The sans-IO core stays free of OpenTelemetry: it only keeps, once asked (``OwnerCore.observe``), the runs a batch
ended and the usage committed, and answers :meth:`~storage_owner.core.OwnerCore.gauges`. This shell turns them into
instruments. The observable instruments are read on the owner's trio thread: a metric reader collecting on a thread
of its own (a periodic exporter) asks the trio loop for one snapshot per collection, so the core is never read
between two statements of a batch.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import trio
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

from protocol import RunRecord, root_span_id_of, trace_id_of
from storage_owner.core import CoreGauges, run_task_id

SCOPE: Final = "tether.owner"
RUN_SPAN: Final = "tether.run"
BATCH_SIZE_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
"""Frames per batch: the commit loop takes at most 8192 (``MAX_BATCH_REQUESTS``)."""
SNAPSHOT_TIMEOUT_S: Final = 5.0
"""A reader on another thread waits at most this long for the owner's loop to answer (a busy loop answers between
two batches); past it, that collection has no gauges."""
SNAPSHOT_REUSE_S: Final = 0.05
MS_TO_NS: Final = 1_000_000

_ROOT_IDS: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("tether_root_ids", default=None)


class OwnerTelemetry:
    """The owner's instruments on ``meter_provider`` and its run spans on ``tracer_provider`` (the global ones when
    ``None``); ``read`` gives what the observable instruments report: the core's gauges, the frames pending, the
    output queued, the peers attached."""

    def __init__(
        self,
        read: Callable[[], tuple[CoreGauges, int, int, int]],
        *,
        log: Callable[[str], None],
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> None:
        self._read = read
        self._log = log
        self._failed = False
        self._token: trio.lowlevel.TrioToken | None = None
        tracer_provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        meter_provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        self._tracer = tracer_provider.get_tracer(SCOPE)
        self._root_ids = _use_root_ids(self._tracer)
        meter = meter_provider.get_meter(SCOPE)
        self._commits = meter.create_counter(
            "tether.owner.commits", unit="{commit}", description="Commits (each takes a seq) applied and committed"
        )
        self._transactions = meter.create_counter(
            "tether.owner.transactions", unit="{transaction}", description="SQLite transactions that wrote (COMMITs)"
        )
        self._batch_size = meter.create_histogram(
            "tether.owner.batch.size",
            unit="{frame}",
            description="Frames handled per transaction of the commit loop",
            explicit_bucket_boundaries_advisory=BATCH_SIZE_BUCKETS,
        )
        self._runs_ended = meter.create_counter(
            "tether.runs.ended", unit="{run}", description="Runs that ended, by status and reason"
        )
        meter.create_observable_gauge(
            "tether.runs", [self._observe_runs], unit="{run}", description="Live (not terminal) runs, by status"
        )
        meter.create_observable_gauge(
            "tether.owner.queue.depth",
            [self._observe_queues],
            unit="{item}",
            description="Frames waiting for the commit loop, tasks ready for a worker, blocked and leased",
        )
        meter.create_observable_gauge(
            "tether.owner.output.queued", [self._observe_output], unit="By", description="Output not yet sent to peers"
        )
        meter.create_observable_gauge(
            "tether.owner.peers", [self._observe_peers], unit="{peer}", description="Peers attached, and workers"
        )
        meter.create_observable_counter(
            "tether.usage.tokens",
            [self._observe_tokens],
            unit="{token}",
            description="Tokens of the results committed since the owner started, by model (or tool) and type",
        )
        meter.create_observable_counter(
            "tether.usage.cost",
            [self._observe_cost],
            unit="{cost}",
            description="Cost of the results committed since the owner started (in the price table's currency)",
        )
        self._snapshot: tuple[CoreGauges, int, int, int] | None = None
        self._snapshot_s = 0.0
        self._head_seq = 0

    def start(self, head_seq: int) -> None:
        """Called on the owner's trio thread once it serves (``head_seq``: the commit log's head): readers on other
        threads reach the loop through it."""
        self._head_seq = head_seq
        self._token = trio.lowlevel.current_trio_token()

    def stop(self) -> None:
        self._token = None

    # ----------------------------------------------------------------------------------------- the commit loop

    def batch(self, frames: int, head_seq: int, wrote: bool, ended_runs: Sequence[RunRecord]) -> None:
        """One batch committed: ``frames`` handled, the commit log's head after it, the runs it ended. Telemetry
        never stops the owner: an error here (a bug, or a provider's) is logged once, and this batch's figures are
        lost."""
        try:
            self._batch(frames, head_seq, wrote, ended_runs)
        except Exception as exc:
            if not self._failed:
                self._failed = True
                self._log(f"tether owner: telemetry failed (the owner goes on; later failures are not logged): {exc!r}")

    def _batch(self, frames: int, head_seq: int, wrote: bool, ended_runs: Sequence[RunRecord]) -> None:
        self._batch_size.record(frames)
        if wrote:
            self._transactions.add(1)
            self._commits.add(head_seq - self._head_seq)
        self._head_seq = head_seq
        for run in ended_runs:
            self._run_ended(run)

    def _run_ended(self, run: RunRecord) -> None:
        attributes: dict[str, Any] = {"tether.run.status": run.status}
        if run.reason is not None:
            attributes["tether.run.reason"] = run.reason
        self._runs_ended.add(1, attributes)
        span_attributes: dict[str, Any] = {
            **attributes,
            "tether.run.id": run.run_id,
            "tether.agent": run.agent,
            "tether.agent.version": run.version,
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": run.agent,
            "gen_ai.conversation.id": run.conversation_id,
            "gen_ai.usage.input_tokens": run.usage.input_tokens,
            "gen_ai.usage.output_tokens": run.usage.output_tokens,
        }
        if run.usage.cost is not None:
            span_attributes["tether.usage.cost"] = run.usage.cost
        if run.error is not None:
            span_attributes["tether.run.error"] = run.error
        trace_id, root_span_id = trace_id_of(run.run_id), root_span_id_of(run.run_id)
        first = run.task_id is None or run.task_id == run_task_id(run.run_id, 1)
        if first and self._root_ids:
            # The run's root span, with the ids every worker span of the run names as its parent.
            token = _ROOT_IDS.set((trace_id, root_span_id))
            try:
                span = self._tracer.start_span(
                    RUN_SPAN,
                    context=trace.set_span_in_context(trace.INVALID_SPAN),
                    attributes=span_attributes,
                    start_time=run.created_at_ms * MS_TO_NS,
                )
            finally:
                _ROOT_IDS.reset(token)
        else:
            # A retried run's end (its root was emitted at its first end), or a provider whose ids cannot be chosen:
            # a child of the run's root.
            root = SpanContext(trace_id, root_span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
            span = self._tracer.start_span(
                RUN_SPAN,
                context=trace.set_span_in_context(NonRecordingSpan(root)),
                attributes=span_attributes,
                start_time=run.created_at_ms * MS_TO_NS,
            )
        if run.status != "completed":
            span.set_status(Status(StatusCode.ERROR, run.error or run.reason or run.status))
        span.end(end_time=max(run.updated_at_ms, run.created_at_ms) * MS_TO_NS)

    # ------------------------------------------------------------------------------------ observable instruments

    def _gauges(self) -> tuple[CoreGauges, int, int, int] | None:
        """The snapshot of this collection: read on the trio thread (at once when called there, else by asking the
        loop); ``None`` if the owner is not serving."""
        token = self._token
        if token is None:
            return None
        if trio.lowlevel.in_trio_run():
            return self._read()
        try:
            return trio.from_thread.run_sync(self._read, trio_token=token)
        except (trio.RunFinishedError, RuntimeError):
            return None

    def _fresh(self) -> tuple[CoreGauges, int, int, int] | None:
        """The snapshot the callbacks of one collection share: taken again once it is older than
        ``SNAPSHOT_REUSE_S`` (a collection calls every callback in turn, within that)."""
        now_s = time.monotonic()
        if self._snapshot is None or now_s - self._snapshot_s > SNAPSHOT_REUSE_S:
            self._snapshot, self._snapshot_s = self._gauges(), now_s
        return self._snapshot

    def _observe_runs(self, options: CallbackOptions) -> Iterable[Observation]:
        snapshot = self._fresh()
        if snapshot is None:
            return []
        return [
            Observation(count, {"tether.run.status": status}) for status, count in snapshot[0].runs_by_status.items()
        ]

    def _observe_queues(self, options: CallbackOptions) -> Iterable[Observation]:
        snapshot = self._fresh()
        if snapshot is None:
            return []
        gauges, pending, _, _ = snapshot
        return [
            Observation(pending, {"tether.queue": "pending_frames"}),
            Observation(gauges.ready_tasks, {"tether.queue": "ready_tasks"}),
            Observation(gauges.blocked_tasks, {"tether.queue": "blocked_tasks"}),
            Observation(gauges.leased_tasks, {"tether.queue": "leased_tasks"}),
        ]

    def _observe_output(self, options: CallbackOptions) -> Iterable[Observation]:
        snapshot = self._fresh()
        return [] if snapshot is None else [Observation(snapshot[2])]

    def _observe_peers(self, options: CallbackOptions) -> Iterable[Observation]:
        snapshot = self._fresh()
        if snapshot is None:
            return []
        return [
            Observation(snapshot[3], {"tether.peer.role": "any"}),
            Observation(snapshot[0].workers, {"tether.peer.role": "worker"}),
        ]

    def _observe_tokens(self, options: CallbackOptions) -> Iterable[Observation]:
        snapshot = self._fresh()
        if snapshot is None:
            return []
        found = []
        for (kind, name), usage in snapshot[0].usage.items():
            base = {"tether.usage.kind": kind, "tether.usage.name": name}
            found.append(Observation(usage.input_tokens, {**base, "gen_ai.token.type": "input"}))
            found.append(Observation(usage.output_tokens, {**base, "gen_ai.token.type": "output"}))
        return found

    def _observe_cost(self, options: CallbackOptions) -> Iterable[Observation]:
        snapshot = self._fresh()
        if snapshot is None:
            return []
        return [
            Observation(usage.cost, {"tether.usage.kind": kind, "tether.usage.name": name})
            for (kind, name), usage in snapshot[0].usage.items()
            if usage.cost is not None
        ]


class _RootIds:
    """An SDK tracer's id generator that gives a run's root span the ids derived from the run (``_ROOT_IDS``, set
    only around that span's start), and defers to the generator it wraps otherwise."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def generate_trace_id(self) -> int:
        ids = _ROOT_IDS.get()
        return self.inner.generate_trace_id() if ids is None else ids[0]

    def generate_span_id(self) -> int:
        ids = _ROOT_IDS.get()
        return self.inner.generate_span_id() if ids is None else ids[1]

    def is_trace_id_random(self) -> bool:
        """A run's trace id is its id (a UUIDv7: a time, then random bits), not random as W3C's flag means it."""
        if _ROOT_IDS.get() is not None:
            return False
        found = getattr(self.inner, "is_trace_id_random", None)
        return bool(found()) if found is not None else False


def _use_root_ids(tracer: Any) -> bool:
    """Whether the owner's tracer can give a run's root span chosen ids: an SDK tracer (its ``id_generator`` is
    wrapped; the tracer is the owner's own instrumentation scope, so no other code's spans are touched). Another
    implementation emits each run's span as a child of the root instead."""
    inner = getattr(tracer, "id_generator", None)
    if inner is None:
        return False
    if not isinstance(inner, _RootIds):
        tracer.id_generator = _RootIds(inner)
    return True
