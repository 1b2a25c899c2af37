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

import atexit
import os
import signal
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar, cast

from stepscope.clock import now_ns, to_unix_ns
from stepscope.metrics.api import MetricData, MetricHandler
from stepscope.metrics.cooperate import pause_for_others
from stepscope.metrics.exporters.base import Exporter
from stepscope.metrics.failures import LOGGER, failure_counts, report_failure
from stepscope.metrics.failures import reset_after_fork as _reset_failures
from stepscope.metrics.instruments import (
    DEFAULT_LIMIT,
    Counter,
    Gauge,
    Histogram,
    Registry,
    Scalar,
)
from stepscope.metrics.points import (
    ExportBatch,
    Family,
    Labels,
    Record,
    ScalarPoint,
    SeriesPoint,
    SummaryValue,
)
from stepscope.metrics.ring import DEFAULT_CAPACITY, Channel, RecordSink, Ring
from stepscope.metrics.spill import SpillFile, default_spill_dir
from stepscope.metrics.values import is_tensor, resolve
from stepscope.steps import current_step, last_step, on_step_declared

__all__ = [
    "Pipeline",
    "PipelineMetricHandler",
    "RetryPolicy",
    "add_exporter",
    "configure_pipeline",
    "counter",
    "flush",
    "gauge",
    "get_pipeline",
    "histogram",
    "open_channel",
    "remove_exporter",
    "scalar",
    "shutdown",
    "telemetry",
]

_NS = 1_000_000_000


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed delivery is retried: ``attempts`` per cycle, then backoff across cycles."""

    attempts: int = 3
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"attempts must be an int, got {self.attempts!r}")
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if not 0 <= self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                "backoffs must satisfy 0 <= initial_backoff_s <= max_backoff_s, got "
                f"{self.initial_backoff_s} and {self.max_backoff_s}"
            )


class _Delivery:
    """Delivery state of one exporter or channel sink: counts, backoff and its spill file."""

    def __init__(self, name: str, target: Exporter | RecordSink, spill: SpillFile) -> None:
        self.name = name
        self.target = target
        self.spill = spill
        self.offered = 0
        self.exported = 0
        self.spilled = 0
        self.dropped: dict[str, int] = {}
        self.failures = 0
        self.backoff_s = 0.0
        self.down_until_ns = 0
        self.last_error = ""

    def drop(self, reason: str, n: int) -> None:
        if n:
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    def reset_after_fork(self) -> None:
        self.offered = self.exported = self.spilled = self.failures = 0
        self.dropped = {}
        self.backoff_s = 0.0
        self.down_until_ns = 0
        self.last_error = ""
        self.spill.after_fork_in_child()


class _SeedRecords:
    """Ring target for values sent through the seed API by :class:`PipelineMetricHandler`."""

    drop_key = "metrics"

    def __init__(self) -> None:
        self.pending: list[Record] = []
        self.totals: dict[tuple[str | None, str], list[float]] = {}

    def _drain(self, data: MetricData, step: int | None) -> None:
        value = float(data.value)
        self.pending.append(
            Record(int(data.timestamp * _NS), data.group_name, str(data.name), value, step)
        )
        key = (data.group_name, str(data.name))
        acc = self.totals.get(key)
        if acc is None:
            self.totals[key] = [1, value]
        else:
            acc[0] += 1
            acc[1] += value

    def take(self) -> list[Record]:
        pending, self.pending = self.pending, []
        return pending

    def families(self) -> list[Family]:
        by_name: dict[str, list[SeriesPoint]] = {}
        for (group, name), (count, total) in self.totals.items():
            labels: Labels = (("group", group or ""),)
            by_name.setdefault(name, []).append(
                SeriesPoint(labels, SummaryValue(total, int(count)))
            )
        return [
            Family(name, "summary", "values reported with put_metric / @prof", "", tuple(points))
            for name, points in by_name.items()
        ]

    def reset(self) -> None:
        self.pending = []
        self.totals = {}


InstrumentT = TypeVar("InstrumentT", Counter, Gauge, Histogram, Scalar)
ExporterT = TypeVar("ExporterT", bound=Exporter)


class Pipeline:
    """Instruments, the ring, exporters and the export thread of one process."""

    def __init__(
        self,
        *,
        interval_s: float = 1.0,
        ring_capacity: int = DEFAULT_CAPACITY,
        exporter_timeout_s: float = 5.0,
        retry: RetryPolicy | None = None,
        shutdown_timeout_s: float = 5.0,
        spill_dir: str | os.PathLike[str] | None = None,
        spill_max_bytes: int = 64 << 20,
        handle_sigterm: bool = True,
    ) -> None:
        self.ring = Ring(ring_capacity)
        self.registry = Registry(self.ring)
        self.seed_records = _SeedRecords()
        self.interval_s = 1.0
        self.exporter_timeout_s = 5.0
        self.retry = RetryPolicy()
        self.shutdown_timeout_s = 5.0
        self.spill_dir = default_spill_dir()
        self.spill_max_bytes = 64 << 20
        self.handle_sigterm = True
        self.configure(
            interval_s=interval_s,
            exporter_timeout_s=exporter_timeout_s,
            retry=retry,
            shutdown_timeout_s=shutdown_timeout_s,
            spill_dir=spill_dir,
            spill_max_bytes=spill_max_bytes,
            handle_sigterm=handle_sigterm,
        )
        self._deliveries: list[_Delivery] = []
        self._channels: dict[str, tuple[Channel, _Delivery]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False
        self._accepted = 0
        self._dropped: dict[str, int] = {}
        self._cycles = 0
        self._ever_exported = False
        self._deadline_ns = 0
        self._abandoned = False
        self._start_unix_ns = to_unix_ns(now_ns())
        self._last_step: int | None = None
        self._make_sync()
        self.ring.set_waker(self._wake_soon)
        _live.add(self)

    def _make_sync(self) -> None:
        self._lock = threading.RLock()
        self._cycle_lock = threading.RLock()
        self._cond = threading.Condition(threading.RLock())
        self._wake = threading.Event()
        self._requests = 0
        self._served = 0
        self._close_all_requested = False

    def _wake_soon(self) -> None:
        self._wake.set()

    # ------------------------------------------------------------------ configuration

    def configure(
        self,
        *,
        interval_s: float | None = None,
        ring_capacity: int | None = None,
        exporter_timeout_s: float | None = None,
        retry: RetryPolicy | None = None,
        shutdown_timeout_s: float | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
        spill_max_bytes: int | None = None,
        handle_sigterm: bool | None = None,
    ) -> None:
        """Change settings; arguments left as None keep their value."""
        for label, value in (
            ("interval_s", interval_s),
            ("exporter_timeout_s", exporter_timeout_s),
            ("shutdown_timeout_s", shutdown_timeout_s),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
            ):
                raise ValueError(f"{label} must be a positive number of seconds, got {value!r}")
        if spill_max_bytes is not None and (
            isinstance(spill_max_bytes, bool)
            or not isinstance(spill_max_bytes, int)
            or spill_max_bytes < 0
        ):
            raise ValueError(f"spill_max_bytes must be an int >= 0, got {spill_max_bytes!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {type(retry).__name__}")
        if ring_capacity is not None:
            self.ring.set_capacity(ring_capacity)
        if interval_s is not None:
            self.interval_s = float(interval_s)
        if exporter_timeout_s is not None:
            self.exporter_timeout_s = float(exporter_timeout_s)
        if retry is not None:
            self.retry = retry
        if shutdown_timeout_s is not None:
            self.shutdown_timeout_s = float(shutdown_timeout_s)
        if spill_dir is not None:
            self.spill_dir = Path(spill_dir)
            for delivery in getattr(self, "_deliveries", []):
                delivery.spill.directory = self.spill_dir
        if spill_max_bytes is not None:
            self.spill_max_bytes = spill_max_bytes
        if handle_sigterm is not None:
            self.handle_sigterm = bool(handle_sigterm)

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
            spill = SpillFile(self.spill_dir, label, self.spill_max_bytes)
            self._deliveries.append(_Delivery(label, exporter, spill))
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
            _close_quietly(exporter)

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
            spill = SpillFile(self.spill_dir, f"channel-{name}", self.spill_max_bytes)
            self._channels[name] = (channel, _Delivery(name, sink, spill))
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
        _close_quietly(delivery.target)
        return done and not left

    # ------------------------------------------------------------------ control

    def flush(self, timeout_s: float | None = None) -> bool:
        """Export everything recorded so far (closing the current step); True when done in time."""
        thread = self._thread
        if thread is None or not thread.is_alive():
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
            return self._served >= ticket

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Export what is left, close the exporters and stop the thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        timeout = self.shutdown_timeout_s if timeout_s is None else float(timeout_s)
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

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` ran."""
        return self._closed

    def _abandon(self) -> None:
        # the thread is stuck in an exporter: what it has not delivered counts as dropped, and
        # whatever it reports later is ignored
        self._abandoned = True
        queued = sum(1 for item in list(self.ring.items) if item[0].drop_key == "metrics")
        leftover = queued
        leftover += sum(s.pending_count() for s in self.registry.scalars())
        leftover += len(self.seed_records.pending)
        self._accepted += queued
        self._drop("shutdown_timeout", leftover)
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

    def _drop(self, reason: str, n: int) -> None:
        if n:
            self._dropped[reason] = self._dropped.get(reason, 0) + n

    # ------------------------------------------------------------------ telemetry

    def produced(self) -> int:
        """Records (scalar samples and seed-API values) offered to the pipeline so far."""
        return self._accepted + self.ring.dropped("metrics")

    def accounting(self) -> dict[str, dict[str, Any]]:
        """Per exporter: produced, exported, spilled and dropped records (by reason)."""
        pipeline_dropped = dict(self._dropped)
        ring_dropped = self.ring.dropped("metrics")
        if ring_dropped:
            pipeline_dropped["ring_full"] = ring_dropped
        out = {}
        for d in list(self._deliveries):
            reasons = dict(pipeline_dropped)
            for reason, n in d.dropped.items():
                reasons[reason] = reasons.get(reason, 0) + n
            out[d.name] = {
                "produced": self.produced(),
                "offered": d.offered,
                "exported": d.exported,
                "spilled": d.spilled,
                "dropped": sum(reasons.values()),
                "dropped_by_reason": reasons,
                "export_failures": d.failures,
                "spill_file": str(d.spill.path) if d.spilled else None,
            }
        return out

    def telemetry(self) -> dict[str, Any]:
        """Self-telemetry: produced/exported/spilled/dropped, errors, queue depth, channels."""
        failures = failure_counts()
        channels = {}
        for name, (channel, d) in list(self._channels.items()):
            reasons = dict(d.dropped)
            ring = self.ring.dropped(channel.drop_key)
            if ring:
                reasons["ring_full"] = ring
            channels[name] = {
                "offered": d.offered,
                "exported": d.exported,
                "spilled": d.spilled,
                "dropped": sum(reasons.values()),
                "dropped_by_reason": reasons,
            }
        return {
            "produced": self.produced(),
            "queue_depth": len(self.ring),
            "ring_capacity": self.ring.capacity,
            "dropped_at_ring": self.ring.dropped(),
            "handler_errors": failures.get("handler_error", 0),
            "failures": failures,
            "overflowed_label_sets": self.registry.overflowed(),
            "cycles": self._cycles,
            "exporters": self.accounting(),
            "channels": channels,
        }

    def _telemetry_families(self) -> list[Family]:
        acc = self.accounting()
        failures = failure_counts()
        dropped: list[SeriesPoint] = []
        for name, a in acc.items():
            for reason, n in a["dropped_by_reason"].items():
                dropped.append(SeriesPoint((("exporter", name), ("reason", reason)), float(n)))

        def per_exporter(key: str) -> tuple[SeriesPoint, ...]:
            return tuple(SeriesPoint((("exporter", n),), float(a[key])) for n, a in acc.items())

        families = [
            Family(
                "stepscope.metrics.records_produced",
                "counter",
                "records (scalar samples, put_metric values) offered to the pipeline",
                "",
                (SeriesPoint((), float(self.produced())),),
            ),
            Family(
                "stepscope.metrics.records_exported",
                "counter",
                "records delivered, per exporter",
                "",
                per_exporter("exported"),
            ),
            Family(
                "stepscope.metrics.records_spilled",
                "counter",
                "records written to the spill file, per exporter",
                "",
                per_exporter("spilled"),
            ),
            Family(
                "stepscope.metrics.records_dropped",
                "counter",
                "records lost, per exporter and reason",
                "",
                tuple(dropped),
            ),
            Family(
                "stepscope.metrics.export_failures",
                "counter",
                "failed delivery attempts, per exporter",
                "",
                per_exporter("export_failures"),
            ),
            Family(
                "stepscope.metrics.handler_errors",
                "counter",
                "exceptions raised by seed-API handlers",
                "",
                (SeriesPoint((), float(failures.get("handler_error", 0))),),
            ),
            Family(
                "stepscope.metrics.queue_depth",
                "gauge",
                "items waiting in the ring",
                "",
                (SeriesPoint((), float(len(self.ring))),),
                "sum",
            ),
        ]
        step = self._last_step
        if step is not None:
            families.append(
                Family(
                    "stepscope.step",
                    "gauge",
                    "the shared step counter",
                    "",
                    (SeriesPoint((), float(step)),),
                    "max",
                )
            )
        return [f for f in families if f.points]

    # ------------------------------------------------------------------ the export thread

    def _ensure_thread(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        _install_exit_hooks(self.handle_sigterm)
        thread = threading.Thread(target=self._run, name="stepscope-metrics-export", daemon=True)
        self._thread = thread
        thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            with self._cond:
                ticket = self._requests
                stopping = self._stopping
                close_all = self._close_all_requested
                self._close_all_requested = False
            try:
                self._cycle(close_all=close_all or stopping, final=stopping)
            except Exception:
                LOGGER.exception("stepscope.metrics: export cycle failed (continuing)")
            if stopping:
                self._close_targets()
            with self._cond:
                self._served = ticket
                self._cycles += 1
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
            records = self.seed_records.take()
            families = self.registry.families(pause_for_others)
            families.extend(self.seed_records.families())
            families.extend(self._telemetry_families())
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
                self._deliver(delivery, batch, final)
            for channel, delivery in list(self._channels.values()):
                pending = channel.take_pending()
                if pending:
                    self._deliver_records(delivery, pending, final)

    def _dispatch(self, items: list[tuple[Any, Any, Any]]) -> None:
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
        for i, (target, a, b) in enumerate(items):
            is_record = target.drop_key == "metrics"
            if is_record:
                self._accepted += 1
            if resolved and i in resolved:
                b = resolved[i]
            elif tensor_at and is_tensor(b):
                self._drop("invalid_value", 1 if is_record else 0)
                continue
            try:
                target._drain(a, b)
            except Exception as exc:
                if is_record:
                    self._drop("invalid_value", 1)
                report_failure("invalid_value", f"{type(target).__name__} value", exc)

    def _remaining_s(self, final: bool) -> float:
        if not final:
            return self.exporter_timeout_s
        left = (self._deadline_ns - now_ns()) / _NS
        return min(self.exporter_timeout_s, left)

    def _attempt(self, delivery: _Delivery, send: Any, final: bool) -> bool:
        now = now_ns()
        if now < delivery.down_until_ns and not final:
            return False
        attempts = 1 if (final and delivery.down_until_ns) else self.retry.attempts
        delay = self.retry.initial_backoff_s
        for attempt in range(attempts):
            timeout = self._remaining_s(final)
            if timeout <= 0:
                break
            try:
                send(timeout)
            except Exception as exc:
                delivery.failures += 1
                delivery.last_error = f"{type(exc).__name__}: {exc}"
                if delivery.down_until_ns == 0 and attempt == 0:
                    LOGGER.warning(
                        "stepscope.metrics: exporter %r failed (%s); retrying with backoff",
                        delivery.name,
                        delivery.last_error,
                    )
                if attempt + 1 < attempts:
                    time.sleep(min(delay, max(0.0, self._remaining_s(final))))
                    delay = min(delay * 2, self.retry.max_backoff_s)
                continue
            if delivery.down_until_ns:
                LOGGER.warning("stepscope.metrics: exporter %r recovered", delivery.name)
            delivery.backoff_s = 0.0
            delivery.down_until_ns = 0
            return True
        delivery.backoff_s = min(
            max(delivery.backoff_s * 2, self.interval_s), self.retry.max_backoff_s
        )
        delivery.down_until_ns = now_ns() + int(delivery.backoff_s * _NS)
        return False

    def _deliver(self, delivery: _Delivery, batch: ExportBatch, final: bool) -> None:
        n = batch.record_count
        delivery.offered += n
        exporter = cast(Exporter, delivery.target)
        delivered = self._attempt(delivery, lambda timeout: exporter.export(batch, timeout), final)
        if self._abandoned:
            return
        if delivered:
            delivery.exported += n
            return
        entries: list[dict[str, Any]] = [
            {
                "kind": "scalar",
                "name": s.name,
                "labels": dict(s.labels),
                "step": s.step,
                "value": s.value,
                "count": s.count,
                "reduce": s.reduce,
                "time_unix_ns": s.time_unix_ns,
            }
            for s in batch.scalars
        ]
        entries.extend(
            {
                "kind": "record",
                "group": r.group,
                "name": r.name,
                "value": r.value,
                "time_unix_ns": r.time_unix_ns,
            }
            for r in batch.records
        )
        self._spill(delivery, entries, n)

    def _deliver_records(self, delivery: _Delivery, records: list[Any], final: bool) -> None:
        n = len(records)
        delivery.offered += n
        sink = cast(RecordSink, delivery.target)
        delivered = self._attempt(
            delivery, lambda timeout: sink.write_records(records, timeout), final
        )
        if self._abandoned:
            return
        if delivered:
            delivery.exported += n
            return
        try:
            entries = [{"kind": "record", "data": sink.spill_form(r)} for r in records]
        except Exception:
            delivery.drop("unserialisable", n)
            return
        self._spill(delivery, entries, n)

    def _spill(self, delivery: _Delivery, entries: list[dict[str, Any]], n: int) -> None:
        if not n:
            return
        delivery.spill.max_bytes = self.spill_max_bytes
        for entry in entries:
            entry["exporter"] = delivery.name
        reason = delivery.spill.write(entries)
        if reason is None:
            delivery.spilled += n
        else:
            delivery.drop(reason, n)

    def _close_targets(self) -> None:
        for delivery in list(self._deliveries):
            _close_quietly(delivery.target)
        for _, delivery in list(self._channels.values()):
            _close_quietly(delivery.target)

    def _closing_line(self) -> None:
        if not self._ever_exported and not self._channels:
            return
        acc = self.accounting()
        spilled = sum(a["spilled"] for a in acc.values())
        dropped = max((a["dropped"] for a in acc.values()), default=0)
        channel_drops = sum(
            c["dropped"] + c["spilled"] for c in self.telemetry()["channels"].values()
        )
        if not (spilled or dropped or channel_drops):
            return
        parts = []
        for name, a in acc.items():
            if a["dropped"] or a["spilled"]:
                reasons = ", ".join(f"{r}={n}" for r, n in sorted(a["dropped_by_reason"].items()))
                where = f" to {a['spill_file']}" if a["spill_file"] else ""
                parts.append(
                    f"{name}: {a['exported']} exported, {a['spilled']} spilled{where}, "
                    f"{a['dropped']} dropped ({reasons or 'none'})"
                )
        if channel_drops:
            parts.append(f"channels: {channel_drops} records dropped or spilled")
        LOGGER.warning("stepscope.metrics: of %d records, %s", self.produced(), "; ".join(parts))

    # ------------------------------------------------------------------ fork

    def _after_fork_child(self) -> None:
        if self._closed:
            # a finished pipeline stays finished; its exporters are not touched in the child
            self._thread = None
            self._make_sync()
            return
        self._make_sync()
        self.ring.reset_after_fork()
        self.ring.set_waker(self._wake_soon)
        self.registry.reset_after_fork()
        self.seed_records.reset()
        self._accepted = 0
        self._dropped = {}
        self._cycles = 0
        self._thread = None
        self._stopping = False
        self._start_unix_ns = to_unix_ns(now_ns())
        for delivery in self._deliveries:
            delivery.reset_after_fork()
            _after_fork_quietly(delivery.target)
        for channel, delivery in self._channels.values():
            channel.take_pending()
            delivery.reset_after_fork()
            _after_fork_quietly(delivery.target)
        if self._deliveries or self._channels:
            self._ensure_thread()


class PipelineMetricHandler(MetricHandler):
    """Sends seed-API values (``put_metric``, ``@prof``) into a pipeline: no I/O on the caller."""

    def __init__(self, pipeline: Pipeline | None = None) -> None:
        target = get_pipeline() if pipeline is None else pipeline
        self._ring = target.ring
        self._records = target.seed_records

    def emit(self, metric_data: MetricData) -> None:
        """Queue one value (with the current step)."""
        self._ring.put(self._records, metric_data, current_step())

    def emit_elapsed(self, group_name: str | None, metric_name: str, elapsed_ns: int) -> None:
        """Queue a duration in milliseconds with nanosecond resolution."""
        wall = to_unix_ns(now_ns()) / _NS
        data = MetricData(wall, group_name, metric_name, elapsed_ns / 1e6)
        self._ring.put(self._records, data, current_step())


def _close_quietly(target: Exporter | RecordSink) -> None:
    try:
        target.close()
    except Exception as exc:
        report_failure("exporter_error", f"{type(target).__name__}.close", exc)


def _after_fork_quietly(target: Exporter | RecordSink) -> None:
    try:
        target.after_fork_in_child()
    except Exception as exc:
        report_failure("exporter_error", f"{type(target).__name__}.after_fork_in_child", exc)


# ---------------------------------------------------------------------- process-wide hooks

_live: weakref.WeakSet[Pipeline] = weakref.WeakSet()


def _export_on_first_step(step: int) -> None:
    """A loop declared its first step: export now, so the step gauge is there from the start."""
    for pipeline in list(_live):
        pipeline._wake_soon()


on_step_declared(_export_on_first_step)
_hooks_installed = False
_sigterm_installed = False


class _Anchor:
    """Keeps the multiprocessing after-fork registration alive."""


_anchor = _Anchor()


def shutdown_all() -> None:
    """Shut down every pipeline of this process (the exit hooks call this)."""
    for pipeline in list(_live):
        try:
            pipeline.shutdown()
        except Exception:
            LOGGER.exception("stepscope.metrics: shutdown failed")


def _register_finalizer(_anchor_obj: object = None) -> None:
    import multiprocessing.util

    # children of multiprocessing leave through os._exit after running these finalizers
    multiprocessing.util.Finalize(None, shutdown_all, exitpriority=100)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    shutdown_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_exit_hooks(handle_sigterm: bool) -> None:
    global _hooks_installed, _sigterm_installed
    if not _hooks_installed:
        _hooks_installed = True
        import multiprocessing.util

        atexit.register(shutdown_all)
        _register_finalizer()
        multiprocessing.util.register_after_fork(_anchor, _register_finalizer)
    if (
        handle_sigterm
        and not _sigterm_installed
        and threading.current_thread() is threading.main_thread()
    ):
        try:
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
                _sigterm_installed = True
        except (ValueError, OSError):
            pass


def _after_fork_in_child() -> None:
    _reset_failures()
    for pipeline in list(_live):
        pipeline._after_fork_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------------- the process pipeline

_default: Pipeline | None = None
_default_lock = threading.Lock()


def get_pipeline() -> Pipeline:
    """The pipeline of this process (created on first use)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Pipeline()
    return _default


def configure_pipeline(**settings: Any) -> Pipeline:
    """Change the process pipeline's settings (see :meth:`Pipeline.configure`)."""
    pipeline = get_pipeline()
    pipeline.configure(**settings)
    return pipeline


def counter(
    name: str, description: str = "", *, unit: str = "", limit: int = DEFAULT_LIMIT
) -> Counter:
    """The counter called ``name`` in the process pipeline."""
    return get_pipeline().counter(name, description, unit=unit, limit=limit)


def gauge(
    name: str,
    description: str = "",
    *,
    unit: str = "",
    limit: int = DEFAULT_LIMIT,
    merge: str = "last",
) -> Gauge:
    """The gauge called ``name`` in the process pipeline."""
    return get_pipeline().gauge(name, description, unit=unit, limit=limit, merge=merge)


def histogram(
    name: str,
    description: str = "",
    *,
    unit: str = "",
    buckets: Sequence[float] | None = None,
    exponential: bool = False,
    scale: int = 3,
    limit: int = DEFAULT_LIMIT,
) -> Histogram:
    """The histogram called ``name`` in the process pipeline."""
    return get_pipeline().histogram(
        name,
        description,
        unit=unit,
        buckets=buckets,
        exponential=exponential,
        scale=scale,
        limit=limit,
    )


def scalar(
    name: str,
    reduce: str = "mean",
    description: str = "",
    *,
    unit: str = "",
    limit: int = DEFAULT_LIMIT,
) -> Scalar:
    """The per-step scalar called ``name`` in the process pipeline."""
    return get_pipeline().scalar(name, reduce, description, unit=unit, limit=limit)


def add_exporter(exporter: ExporterT, name: str | None = None) -> ExporterT:
    """Start exporting the process pipeline to ``exporter``."""
    return get_pipeline().add_exporter(exporter, name)


def remove_exporter(exporter: Exporter) -> None:
    """Stop exporting the process pipeline to ``exporter``."""
    get_pipeline().remove_exporter(exporter)


def open_channel(name: str, sink: RecordSink) -> Channel:
    """A non-blocking lane through the process pipeline's ring to ``sink``."""
    return get_pipeline().open_channel(name, sink)


def flush(timeout_s: float | None = None) -> bool:
    """Export everything the process pipeline holds; True when done in time."""
    return get_pipeline().flush(timeout_s)


def shutdown(timeout_s: float | None = None) -> None:
    """Final export and stop of the process pipeline."""
    get_pipeline().shutdown(timeout_s)


def telemetry() -> dict[str, Any]:
    """Self-telemetry of the process pipeline."""
    return get_pipeline().telemetry()
