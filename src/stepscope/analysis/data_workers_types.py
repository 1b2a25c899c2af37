"""The DataLoader workers section of a report (plain data; ``analysis.data_workers`` fills it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchTaken", "DataWorkersSummary", "LoaderReport", "WorkerFunction", "WorkerShare"]


@dataclass(frozen=True)
class BatchTaken:
    """A batch a step took: which one, the worker that made it, when it was ready against when
    the step asked for it, and the worker's time on it."""

    step: int | None
    epoch: int
    batch: int
    worker: int
    """The worker's id (0 ..), -1 for a batch the loop made itself (``num_workers=0``)."""
    worker_pid: int | None
    status: str
    """``ahead`` (ready more than ``JUST_IN_TIME_NS`` before the step asked),
    ``just_in_time``, ``late`` (ready after), ``in_loop`` (made by the loop while it waited),
    ``unknown`` (made before recording began)."""
    margin_ns: int | None
    """When the step asked minus when the worker finished the batch (negative: late)."""
    wait_ns: int
    """How long the loop waited in the iterator for this batch."""
    dataset_ns: int | None
    """The worker's wall time in the dataset (``__getitem__``/``__next__``) for this batch."""
    dataset_cpu_ns: int | None
    """The worker's CPU time in the dataset for this batch."""
    collate_ns: int | None
    pin_ns: int
    """Pinning the batch in the main process (``pin_memory=True`` on an accelerator)."""
    transfer_ns: int | None
    """From the moment both the batch was done and the step asked until the loop had it,
    without pinning: the result crossing from the worker."""
    ready_ahead: int | None
    """Batches of this loader done and not yet taken when the step asked (this one included)."""


@dataclass(frozen=True)
class WorkerShare:
    """One worker's part: how busy it was over the analysed steps and on what."""

    worker: int
    pids: list[int]
    """Its process ids (a new process per epoch without ``persistent_workers``)."""
    batches: int
    busy_ns: int
    busy_pct: float
    """Time making batches over ``active_ns`` (0-100)."""
    dataset_ns: int
    collate_ns: int
    exited: bool = False
    """A process of this worker had exited when the window was collected."""
    active_ns: int = 0
    """Its active time in the analysed steps: from its first batch to its exit (or their
    end), over all its processes."""


@dataclass(frozen=True)
class WorkerFunction:
    """A function the workers' stack samples found in their dataset code."""

    name: str
    self_samples: int
    total_samples: int
    self_pct: float
    """Share of the workers' busy samples inside the dataset part of their batches (0-100)."""


@dataclass(frozen=True)
class LoaderReport:
    """One DataLoader over the analysed steps."""

    source: str
    loader: int
    """The loader's number in its process (1 for the first one iterated while recording)."""
    settings: dict[str, Any]
    """As the program set them: ``num_workers``, ``prefetch_factor``, ``pin_memory``,
    ``persistent_workers``, ``in_order``, ``batch_size``, ``start_method``, ``dataset``..."""
    workers: list[WorkerShare]
    steps: list[BatchTaken]
    ahead: int
    just_in_time: int
    late: int
    in_loop: int
    unknown: int
    wait_ns: int
    """Time the loop waited for this loader's batches over the analysed steps."""
    ready_ahead_median: float | None
    functions: list[WorkerFunction]
    dataset_samples: int
    """The workers' busy samples inside the dataset part of their batches."""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DataWorkersSummary:
    """Every DataLoader the trace(s) recorded."""

    loaders: list[LoaderReport]
    span_ns: int
    """The analysed steps' wall time (first start to last end)."""
