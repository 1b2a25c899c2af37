"""The metrics pipeline: instruments and a ring on the caller's side, one export thread per process.

Every ``interval_s`` (and on :meth:`Pipeline.flush`) the export thread drains the ring (scalar
samples, seed-API records, deferred tensor values, channel records), closes finished steps,
snapshots the instruments and hands one :class:`~stepscope.metrics.points.ExportBatch` to each
exporter.  A failed delivery is retried with backoff; a backend that stays down gets its
batches spilled to a JSON-lines file.  Nothing is lost silently: the self-telemetry counts what
was exported, spilled and dropped (by reason), and shutdown prints one line when anything was
dropped or spilled.

Shutdown runs at exit through ``atexit`` and ``multiprocessing.util.Finalize`` (children of
multiprocessing skip atexit) and, when no other handler is installed, on SIGTERM.  After a fork
the child starts empty (fresh locks, thread and series) and never re-exports the parent's data.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from stepscope.clock import now_ns, to_unix_ns
from stepscope.failures import is_strict
from stepscope.metrics import hooks
from stepscope.metrics.api_adapter import ApiRecords, PipelineMetricHandler
from stepscope.metrics.cooperate import pause_for_others
from stepscope.metrics.delivery import Delivery, after_fork_quietly, close_quietly
from stepscope.metrics.exporters.base import Exporter
from stepscope.metrics.failures import LOGGER, report_failure
from stepscope.metrics.instruments import DEFAULT_LIMIT, Counter, Gauge, Histogram
from stepscope.metrics.points import ExportBatch, ScalarPoint
from stepscope.metrics.registry import Registry
from stepscope.metrics.ring import Channel, RecordSink, Ring, RingTarget
from stepscope.metrics.scalars import Scalar
from stepscope.metrics.settings import (
    PipelineOptions,
    PipelineSettings,
    RetryPolicy,
    settings_with,
)
from stepscope.metrics.spill import SpillFile
from stepscope.metrics.telemetry import Tally, closing_line, telemetry_families
from stepscope.metrics.values import is_tensor, resolve
from stepscope.steps import current_step, last_step

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Pipeline"]

_NS = 1_000_000_000


InstrumentT = TypeVar("InstrumentT", Counter, Gauge, Histogram, Scalar)
ExporterT = TypeVar("ExporterT", bound=Exporter)


class Pipeline:
    """Instruments, the ring, exporters and the export thread of one process."""

    def __init__(
        self, settings: PipelineSettings | None = None, **changes: Unpack[PipelineOptions]
    ) -> None:
        """Make a pipeline with ``settings`` (default: :class:`PipelineSettings`'s defaults),
        changed by keyword arguments as in :meth:`configure`."""
        self._settings = settings_with(settings or PipelineSettings(), dict(changes))
        self.ring = Ring(self._settings.ring_capacity)
        self.registry = Registry(self.ring)
        self.api_records = ApiRecords()
        self.tally = Tally(self.ring)
        self._deliveries: list[Delivery] = []
        self._channels: dict[str, tuple[Channel, Delivery]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False
        self._ever_exported = False
        self._deadline_ns = 0
        self._abandoned = False
        self._deferred: BaseException | None = None
        self._start_unix_ns = to_unix_ns(now_ns())
        self._last_step: int | None = None
        self._make_sync()
        self.ring.set_waker(self.request_export)
        hooks.track(self)

    def _make_sync(self) -> None:
        self._lock = threading.RLock()
        self._cycle_lock = threading.RLock()
        self._cond = threading.Condition(threading.RLock())
        self._wake = threading.Event()
        self._requests = 0
        self._served = 0
        self._close_all_requested = False

    def request_export(self) -> None:
        """Ask the export thread to export soon (never waits)."""
        self._wake.set()

    # ------------------------------------------------------------------ configuration

    @property
    def settings(self) -> PipelineSettings:
        """The settings in force (a frozen :class:`PipelineSettings`)."""
        return self._settings

    def configure(
        self, settings: PipelineSettings | None = None, **changes: Unpack[PipelineOptions]
    ) -> None:
        """Change settings: to ``settings`` if given, then each keyword that is not None."""
        new = settings_with(settings or self._settings, dict(changes))
        if new.ring_capacity != self._settings.ring_capacity:
            self.ring.set_capacity(new.ring_capacity)
        if new.spill_dir != self._settings.spill_dir:
            for delivery in self._deliveries:
                delivery.spill.directory = new.spill_dir
        self._settings = new

    @property
    def interval_s(self) -> float:
        """Seconds between two exports."""
        return self._settings.interval_s

    @property
    def exporter_timeout_s(self) -> float:
        """Seconds one delivery attempt may take."""
        return self._settings.exporter_timeout_s

    @property
    def retry(self) -> RetryPolicy:
        """How failed deliveries are retried."""
        return self._settings.retry

    @property
    def shutdown_timeout_s(self) -> float:
        """Seconds the final export may take."""
        return self._settings.shutdown_timeout_s

    @property
    def spill_dir(self) -> Path:
        """Where spill files go."""
        return self._settings.spill_dir

    @property
    def spill_max_bytes(self) -> int:
        """Byte budget of each spill file."""
        return self._settings.spill_max_bytes

    @property
    def handle_sigterm(self) -> bool:
        """Whether SIGTERM flushes (when no other handler is installed)."""
        return self._settings.handle_sigterm

    # ------------------------------------------------------------------ instruments

    def _register(
        self, instrument_type: type[InstrumentT], name: str, options: tuple[Any, ...], make: Any
    ) -> InstrumentT:
        found = self.registry.register(name, instrument_type.kind, options, make)
        return cast(InstrumentT, found)

    def counter(
        self, name: str, description: str = "", *, unit: str = "", limit: int = DEFAULT_LIMIT
    ) -> Counter:
        """The counter called ``name`` (created on first use)."""
        return self._register(
            Counter, name, (), lambda: Counter(name, description, unit, limit, self.ring)
        )

    def gauge(
        self,
        name: str,
        description: str = "",
        *,
        unit: str = "",
        limit: int = DEFAULT_LIMIT,
        merge: str = "last",
    ) -> Gauge:
        """The gauge called ``name``; ``merge`` combines processes on one endpoint."""
        return self._register(
            Gauge,
            name,
            (merge,),
            lambda: Gauge(name, description, unit, limit, merge, self.ring),
        )

    def histogram(
        self,
        name: str,
        description: str = "",
        *,
        unit: str = "",
        buckets: Sequence[float] | None = None,
        exponential: bool = False,
        scale: int = 3,
        limit: int = DEFAULT_LIMIT,
    ) -> Histogram:
        """The histogram called ``name`` (explicit ``buckets`` or ``exponential=True``)."""
        made = Histogram(name, description, unit, limit, self.ring, buckets, exponential, scale)
        return self._register(Histogram, name, made.options, lambda: made)

    def scalar(
        self,
        name: str,
        reduce: str = "mean",
        description: str = "",
        *,
        unit: str = "",
        limit: int = DEFAULT_LIMIT,
    ) -> Scalar:
        """The per-step scalar called ``name``; ``reduce`` folds the values of one step."""
        return self._register(
            Scalar,
            name,
            (reduce,),
            lambda: Scalar(name, description, unit, limit, reduce, self.ring),
        )

    def handler(self) -> PipelineMetricHandler:
        """A seed-API handler sending ``put_metric`` / ``@prof`` values into this pipeline."""
        return PipelineMetricHandler(self)

    # ------------------------------------------------------------------ exporters and channels

    def add_exporter(self, exporter: ExporterT, name: str | None = None) -> ExporterT:
        """Start exporting to ``exporter`` (starts the export thread on first use)."""
        if not isinstance(exporter, Exporter):
            raise TypeError(
                f"exporter must be a stepscope.metrics Exporter, got {type(exporter).__name__}; "
                "wrap a MetricHandler with HandlerExporter(handler)"
            )
        with self._lock:
            if self._closed:
                raise RuntimeError("the metrics pipeline was shut down; no exporter can be added")
            if any(d.target is exporter for d in self._deliveries):
                return exporter
            label = self._unique_name(name or exporter.name)
            spill = SpillFile(self._settings.spill_dir, label, self._settings.spill_max_bytes)
            self._deliveries.append(Delivery(label, exporter, spill))
            self._ever_exported = True
            self._ensure_thread()
        return exporter

    def _unique_name(self, base: str) -> str:
        taken = {d.name for d in self._deliveries}
        label, n = base, 1
        while label in taken:
            n += 1
            label = f"{base}-{n}"
        return label

    def remove_exporter(self, exporter: Exporter) -> None:
        """Stop exporting to ``exporter`` and close it."""
        with self._cycle_lock, self._lock:
            kept = [d for d in self._deliveries if d.target is not exporter]
            removed = len(kept) != len(self._deliveries)
            self._deliveries = kept
        if removed:
            close_quietly(exporter)

    def exporters(self) -> list[Exporter]:
        """The exporters in delivery order."""
        return [cast(Exporter, d.target) for d in self._deliveries]

    def open_channel(self, name: str, sink: RecordSink) -> Channel:
        """A non-blocking lane to ``sink``: ``channel.put(record)``; the export thread writes.

        Opening the same name with the same sink returns the same channel.
        """
        if not isinstance(sink, RecordSink):
            raise TypeError(f"sink must be a RecordSink, got {type(sink).__name__}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"channel name must be a non-empty str, got {name!r}")
        with self._lock:
            found = self._channels.get(name)
            if found is not None:
                if found[0].sink is not sink:
                    raise ValueError(
                        f"channel {name!r} is already open with another sink; use another name"
                    )
                return found[0]
            if self._closed:
                raise RuntimeError("the metrics pipeline was shut down; no channel can be opened")
            channel = Channel(name, sink, self.ring)
            spill = SpillFile(
                self._settings.spill_dir, f"channel-{name}", self._settings.spill_max_bytes
            )
            self._channels[name] = (channel, Delivery(name, sink, spill))
            self._ensure_thread()
            return channel

    def close_channel(self, name: str, timeout_s: float | None = 10.0) -> bool:
        """Deliver what the channel holds, then close it and its sink; True when all was delivered.

        Records put on a closed channel are refused and counted as dropped.
        """
        found = self._channels.get(name)
        if found is None:
            return True
        done = self.flush(timeout_s)
        with self._cycle_lock, self._lock:
            channel, delivery = found
            channel.closed = True
            self._channels.pop(name, None)
            left = channel.take_pending()
            delivery.drop("closed", len(left))
        close_quietly(delivery.target)
        return done and not left

    # ------------------------------------------------------------------ control

    def flush(self, timeout_s: float | None = None) -> bool:
        """Export everything recorded so far (closing the current step); True when done in time."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            self._raise_deferred()
            return not (self._deliveries or self._channels) or self._closed
        if threading.current_thread() is thread:
            self._cycle(close_all=True, final=False)
            return True
        with self._cond:
            self._requests += 1
            self._close_all_requested = True
            ticket = self._requests
            self._wake.set()
            self._cond.wait_for(lambda: self._served >= ticket or not thread.is_alive(), timeout_s)
            done = self._served >= ticket
        self._raise_deferred()
        return done

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Export what is left, close the exporters and stop the thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        timeout = self._settings.shutdown_timeout_s if timeout_s is None else float(timeout_s)
        self._deadline_ns = now_ns() + int(timeout * _NS)
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            with self._cond:
                self._stopping = True
                self._requests += 1
            self._wake.set()
            thread.join(timeout)
            if thread.is_alive():
                self._abandon()
        elif self._deliveries or self._channels:
            self._stopping = True
            try:
                self._cycle(close_all=True, final=True)
            finally:
                self._close_targets()
        self._closing_line()
        self._raise_deferred()

    def defer_failure(self, exc: BaseException) -> None:
        """Keep the first failure raised under ``config.strict`` on the export thread; the
        caller's next :meth:`flush` or :meth:`shutdown` re-raises it."""
        if self._deferred is None:
            self._deferred = exc

    def _raise_deferred(self) -> None:
        exc, self._deferred = self._deferred, None
        if exc is not None and is_strict():
            raise exc

    @property
    def abandoned(self) -> bool:
        """Whether shutdown gave up waiting for the export thread (stuck in an exporter)."""
        return self._abandoned

    def remaining_s(self, final: bool) -> float:
        """Seconds one delivery attempt may take now (bounded by the shutdown deadline)."""
        timeout = self._settings.exporter_timeout_s
        if not final:
            return timeout
        return min(timeout, (self._deadline_ns - now_ns()) / _NS)

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` ran."""
        return self._closed

    def _abandon(self) -> None:
        # the thread is stuck in an exporter: what it has not delivered counts as dropped, and
        # whatever it reports later is ignored
        self._abandoned = True
        queued = sum(1 for item in list(self.ring.items) if item[0].is_record)
        leftover = queued
        leftover += sum(s.pending_count() for s in self.registry.scalars())
        leftover += len(self.api_records.pending)
        self.tally.accepted += queued
        self.tally.drop("shutdown_timeout", leftover)
        for delivery in self._deliveries:
            in_flight = delivery.offered - delivery.exported - delivery.spilled
            in_flight -= sum(delivery.dropped.values())
            delivery.drop("shutdown_timeout", in_flight)
            leftover += in_flight
        LOGGER.warning(
            "stepscope.metrics: an exporter did not finish within the shutdown timeout; "
            "%d records were not exported",
            leftover,
        )

    # ------------------------------------------------------------------ telemetry

    def produced(self) -> int:
        """Records (scalar samples and torchelastic API values) offered to the pipeline so far."""
        return self.tally.produced()

    def accounting(self) -> dict[str, dict[str, Any]]:
        """Per exporter: produced, exported, spilled and dropped records (by reason)."""
        return self.tally.accounting(self._deliveries)

    def telemetry(self) -> dict[str, Any]:
        """Self-telemetry: produced/exported/spilled/dropped, errors, queue depth, channels."""
        return self.tally.telemetry(self._deliveries, self._channels, self.registry.overflowed())

    # ------------------------------------------------------------------ the export thread

    def _ensure_thread(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        hooks.install_exit_hooks(self._settings.handle_sigterm)
        thread = threading.Thread(target=self._run, name="stepscope-metrics-export", daemon=True)
        self._thread = thread
        thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._settings.interval_s)
            self._wake.clear()
            with self._cond:
                ticket = self._requests
                stopping = self._stopping
                close_all = self._close_all_requested
                self._close_all_requested = False
            try:
                self._cycle(close_all=close_all or stopping, final=stopping)
            except Exception as exc:
                if is_strict():
                    self.defer_failure(exc)
                LOGGER.exception("stepscope.metrics: export cycle failed (continuing)")
            if stopping:
                try:
                    self._close_targets()
                except Exception as exc:  # config.strict: re-raised by shutdown()
                    self.defer_failure(exc)
            with self._cond:
                self._served = ticket
                self.tally.cycles += 1
                self._cond.notify_all()
            if stopping:
                return

    def _cycle(self, *, close_all: bool, final: bool) -> None:
        with self._cycle_lock:
            now_unix = to_unix_ns(now_ns())
            self._dispatch(self.ring.drain())
            step_now = current_step()
            self._last_step = last_step()
            scalars: list[ScalarPoint] = []
            for series in self.registry.scalars():
                scalars.extend(series.close_steps(step_now, close_all, now_unix))
            records = self.api_records.take()
            families = self.registry.families(pause_for_others)
            families.extend(self.api_records.families())
            families.extend(
                telemetry_families(
                    self.accounting(), self.produced(), len(self.ring), self._last_step
                )
            )
            batch = ExportBatch(
                now_unix,
                self._start_unix_ns,
                tuple(families),
                tuple(scalars),
                tuple(records),
                final,
                os.getpid(),
                step=self._last_step,
            )
            for delivery in list(self._deliveries):
                delivery.export_batch(batch, self, final)
            for channel, delivery in list(self._channels.values()):
                pending = channel.take_pending()
                if pending:
                    delivery.write_records(pending, self, final)

    def _dispatch(self, items: list[tuple[RingTarget, Any, Any]]) -> None:
        if not items:
            return
        tensor_at = [i for i, item in enumerate(items) if is_tensor(item[2])]
        resolved: dict[int, float] = {}
        if tensor_at:
            try:
                values = resolve([items[i][2] for i in tensor_at])
                resolved = dict(zip(tensor_at, values, strict=True))
            except Exception as exc:
                report_failure("invalid_value", "tensor values", exc)
        tally = self.tally
        for i, (target, a, b) in enumerate(items):
            is_record = target.is_record
            if is_record:
                tally.accepted += 1
            if resolved and i in resolved:
                b = resolved[i]
            elif tensor_at and is_tensor(b):
                tally.drop("invalid_value", 1 if is_record else 0)
                continue
            try:
                target.drain(a, b)
            except Exception as exc:
                if is_record:
                    tally.drop("invalid_value", 1)
                report_failure("invalid_value", f"{type(target).__name__} value", exc)

    def _close_targets(self) -> None:
        for delivery in list(self._deliveries):
            close_quietly(delivery.target)
        for _, delivery in list(self._channels.values()):
            close_quietly(delivery.target)

    def _closing_line(self) -> None:
        if not self._ever_exported and not self._channels:
            return
        channels = self.tally.channels(self._channels)
        closing_line(self.accounting(), channels, self.produced())

    # ------------------------------------------------------------------ fork

    def after_fork_in_child(self) -> None:
        """Start empty in a forked child: fresh locks, ring, series and thread."""
        if self._closed:
            # a finished pipeline stays finished; its exporters are not touched in the child
            self._thread = None
            self._make_sync()
            return
        self._make_sync()
        self.ring.reset_after_fork()
        self.ring.set_waker(self.request_export)
        self.registry.reset_after_fork()
        self.api_records.reset()
        self.tally.reset()
        self._deferred = None
        self._thread = None
        self._stopping = False
        self._start_unix_ns = to_unix_ns(now_ns())
        for delivery in self._deliveries:
            delivery.reset_after_fork()
            after_fork_quietly(delivery.target)
        for channel, delivery in self._channels.values():
            channel.take_pending()
            delivery.reset_after_fork()
            after_fork_quietly(delivery.target)
        if self._deliveries or self._channels:
            self._ensure_thread()
