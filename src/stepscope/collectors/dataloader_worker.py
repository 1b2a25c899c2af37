"""Inside a DataLoader worker process: torch's worker loop, with its batches recorded.

``HookedWorkerLoop`` stands in for ``torch.utils.data._utils.worker._worker_loop`` while
stepscope's hooks are installed (``dataloader_hooks``).  torch starts each worker process with
it as the target; it finds the channel of the iterator that started the worker (carried in its
pickled form under spawn and forkserver, in the forking thread's ``pending`` under fork), and
calls torch's own loop with every argument as torch gave it, except that the index queue, the
result queue and ``collate_fn`` are wrapped: taking a task begins a batch record, collate marks
its split, putting the result ends it.  The user's ``worker_init_fn`` is torch's to call, as
ever.  With no channel, or anything unexpected, torch's loop runs untouched.

While the channel says a window is sampling, the worker samples its own main thread
(``Sampler``, at the profile's rate) and a watcher thread writes the samples beside the ring
when the window ends (or the worker leaves), then acknowledges.  Nothing here ever raises
into the loop: a failure is counted in the worker's region and recording goes on without it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

from stepscope.clock import now_ns
from stepscope.collectors.dataloader_ring import (
    F_COLLATE_END,
    F_COLLATE_START,
    F_CPU_COLLATE_END,
    F_CPU_COLLATE_START,
    KIND_BATCH,
    KIND_END,
    KIND_ERROR,
    R_ACK,
    R_EXITED,
    R_SAMPLING,
    WorkerSlot,
    samples_file,
)
from stepscope.jsonenc import json_bytes
from stepscope.trace.model import TraceBuilder
from stepscope.trace.names import hide_thread

__all__ = ["HookedWorkerLoop", "Marks", "TimedCollate", "pending", "torch_worker_loop"]

WATCH_INTERVAL_S = 0.02
"""How often a sampling worker looks whether its window ended (each look takes the GIL from
the worker's loop: rarely enough to cost nothing, often enough that a window's end waits little)."""
SAMPLER_STOP_S = 5.0
WATCHER_NAME = "stepscope-dataloader-watch"
_WANTED = ("index_queue", "data_queue", "collate_fn", "worker_id", "done_event")

pending = threading.local()
"""``pending.path``: the channel of the iterator whose workers this thread is starting."""
original_loop: list[Callable[..., Any]] = []
"""torch's own ``_worker_loop`` while hooked (in the main process and its forked children)."""


def torch_worker_loop() -> Callable[..., Any]:
    """torch's own worker loop (a spawned worker imports torch's module unhooked)."""
    if original_loop:
        return original_loop[0]
    from torch.utils.data._utils import worker

    loop: Callable[..., Any] = worker._worker_loop
    if isinstance(loop, HookedWorkerLoop):  # never reached: hooked means original_loop is set
        raise RuntimeError("torch's worker loop is hooked but its original is unknown")
    return loop


class HookedWorkerLoop:
    """torch's ``_worker_loop`` with the batches of an instrumented iterator recorded."""

    __slots__ = ("path",)

    def __init__(self, path: str | None = None) -> None:
        self.path = path

    def _channel(self) -> str | None:
        return self.path if self.path is not None else getattr(pending, "path", None)

    def __reduce__(self) -> tuple[type[HookedWorkerLoop], tuple[str | None]]:
        # spawn/forkserver pickle the target in the thread that starts the worker
        return HookedWorkerLoop, (self._channel(),)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        original = torch_worker_loop()
        path = self._channel()
        plan = _instrumented(original, path, args, kwargs) if path is not None else None
        if plan is None:
            return original(*args, **kwargs)
        new_args, new_kwargs, recorder = plan
        try:
            return original(*new_args, **new_kwargs)
        finally:
            recorder.close()


def _instrumented(
    original: Callable[..., Any], path: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], WorkerRecorder] | None:
    """torch's arguments with the queues and collate wrapped, or None (run torch's loop as
    it is) when this torch's loop takes other arguments or the channel cannot be opened."""
    try:
        bound = inspect.signature(original).bind(*args, **kwargs)
        given = bound.arguments
        if not all(name in given for name in _WANTED):
            return None
        slot = WorkerSlot(path, int(given["worker_id"]))
    except Exception:  # a torch this does not know, a channel gone: record nothing
        return None
    recorder = WorkerRecorder(slot, given["done_event"])
    given["index_queue"] = IndexQueue(given["index_queue"], recorder)
    given["data_queue"] = DataQueue(given["data_queue"], recorder)
    given["collate_fn"] = TimedCollate(given["collate_fn"], recorder)
    return bound.args, bound.kwargs, recorder


class WorkerRecorder:
    """One worker's batches and samples, written to its region of the channel."""

    def __init__(self, slot: WorkerSlot, done_event: Any) -> None:
        self.slot = slot
        self.done = done_event
        self.epoch = 0
        self.batch: int | None = None
        self.ended = False
        """An iterable dataset ended in this worker (torch skips its tasks until resumed)."""
        self.generation = 0
        self._sampler: Any = None
        self._watcher: threading.Thread | None = None
        self._leaving = threading.Event()
        self._lock = threading.Lock()

    def failed(self) -> None:
        """Count a failure of the recorder (never raised into torch's loop)."""
        with contextlib.suppress(Exception):
            self.slot.add_error()

    def task(self, task: Any) -> None:
        """torch's loop took ``task`` from the index queue."""
        try:
            if type(task) is tuple and len(task) == 2:
                if self.batch is not None:  # the previous one was never made (shutting down)
                    self.batch = None
                    self.slot.drop_current()
                if not self.slot.armed or self.ended or self.done.is_set():
                    return
                generation, rate_hz = self.slot.sampling
                if generation and generation != self.generation:  # before the batch's clock
                    self._start_sampling(generation, rate_hz)
                self.batch = task[0]
                self.slot.begin(self.epoch, task[0], now_ns())
            elif type(task).__name__ == "_ResumeIteration":  # persistent workers: next epoch
                self.epoch += 1
                self.ended = False
        except Exception:
            self.failed()

    def mark(self, field: int, cpu_field: int) -> None:
        """A split inside the batch in progress."""
        try:
            self.slot.mark(field, cpu_field, now_ns())
        except Exception:
            self.failed()

    def put(self, item: Any) -> None:
        """torch's loop sends ``item`` (``(task index, data)``) to the main process."""
        if self.batch is None:
            return
        try:
            if type(item) is tuple and len(item) == 2 and item[0] == self.batch:
                name = type(item[1]).__name__
                kind = (
                    KIND_ERROR
                    if name == "ExceptionWrapper"
                    else KIND_END
                    if name == "_IterableDatasetStopIteration"
                    else KIND_BATCH
                )
                self.ended = self.ended or kind == KIND_END
                self.batch = None
                self.slot.end(kind, now_ns())
        except Exception:
            self.failed()

    # -- sampling ---------------------------------------------------------------------------
    def _start_sampling(self, generation: int, rate_hz: float) -> None:
        from stepscope.collectors.sampler import Sampler

        self._flush(self.generation)  # a run whose end this worker has not seen yet
        sampler = Sampler(rate_hz, thread_ids=[threading.get_native_id()])
        sampler.start()
        with self._lock:
            self._sampler, self.generation = sampler, generation
        self.slot.set_word(R_SAMPLING, generation)
        watcher = threading.Thread(
            target=self._watch, args=(generation,), name=WATCHER_NAME, daemon=True
        )
        self._watcher = watcher
        watcher.start()

    def _watch(self, generation: int) -> None:
        hide_thread(threading.get_native_id())
        try:
            while not self._leaving.wait(WATCH_INTERVAL_S):
                if self.slot.sampling[0] != generation:
                    break
            self._flush(generation)
        except Exception:
            self.failed()
        finally:
            hide_thread(threading.get_native_id(), False)

    def _flush(self, generation: int) -> None:
        """Stop sampling run ``generation`` and write its samples, then acknowledge."""
        with self._lock:
            sampler = self._sampler
            if sampler is None or generation != self.generation:
                return
            self._sampler = None
            data = sampler.stop(SAMPLER_STOP_S)
            payload = json_bytes(samples_payload(data, sampler.describe(data)))
            path = samples_file(self.slot.directory, self.slot.worker, generation)
            temporary = f"{path}.{os.getpid()}.tmp"
            with open(temporary, "wb") as out:
                out.write(payload)
            os.replace(temporary, path)
            self.slot.set_word(R_ACK, generation)

    def close(self) -> None:
        """torch's loop returned (or raised): write the samples of a run in progress."""
        with contextlib.suppress(Exception):
            self.slot.set_word(R_EXITED, now_ns())
        self._leaving.set()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(SAMPLER_STOP_S)
        with contextlib.suppress(Exception):
            self.slot.close()


def samples_payload(data: Any, info: dict[str, Any]) -> dict[str, Any]:
    """A sampling run as plain JSON values: frames, stacks (parent, frame) and samples, with
    stepscope's own and the launcher's frames left out as for the program's own samples."""
    from stepscope.collectors.sampler import add_samples

    builder = TraceBuilder(base_time_ns=0)
    add_samples(builder, data, 0)
    trace = builder.build()
    strings, frames, stacks = trace.strings, trace.tables["frames"], trace.tables["stacks"]
    samples = trace.samples
    return {
        "frames": [
            [strings[name], strings[file], line]
            for name, file, line in zip(
                frames["name"].tolist(),
                frames["file"].tolist(),
                frames["line"].tolist(),
                strict=True,
            )
        ],
        "stack_parent": stacks["parent"].tolist(),
        "stack_frame": stacks["frame"].tolist(),
        "ts_ns": samples["ts_ns"].tolist(),
        "stack": samples["stack"].tolist(),
        "idle": samples["idle"].tolist(),
        "info": info,
    }


class IndexQueue:
    """torch's index queue, telling the recorder of each task taken."""

    __slots__ = ("_queue", "_recorder")

    def __init__(self, queue: Any, recorder: WorkerRecorder) -> None:
        self._queue, self._recorder = queue, recorder

    def get(self, *args: Any, **kwargs: Any) -> Any:
        """Take the next task (as the queue's ``get``)."""
        task = self._queue.get(*args, **kwargs)
        self._recorder.task(task)
        return task

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


class DataQueue:
    """torch's result queue, telling the recorder of each result sent."""

    __slots__ = ("_queue", "_recorder")

    def __init__(self, queue: Any, recorder: WorkerRecorder) -> None:
        self._queue, self._recorder = queue, recorder

    def put(self, item: Any, *args: Any, **kwargs: Any) -> Any:
        """Send a result (as the queue's ``put``)."""
        self._recorder.put(item)
        return self._queue.put(item, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


class Marks(Protocol):
    """What ``TimedCollate`` marks: a batch in progress (a worker's, or the loop's own)."""

    @property
    def batch(self) -> int | None: ...
    def mark(self, field: int, cpu_field: int) -> None: ...


class TimedCollate:
    """The loader's ``collate_fn``, with its start and end marked in the batch in progress."""

    __slots__ = ("_fn", "_recorder")

    def __init__(self, fn: Callable[[Any], Any], recorder: Marks) -> None:
        self._fn, self._recorder = fn, recorder

    def __call__(self, data: Any) -> Any:
        recorder = self._recorder
        if recorder.batch is None:
            return self._fn(data)
        recorder.mark(F_COLLATE_START, F_CPU_COLLATE_START)
        try:
            return self._fn(data)
        finally:
            recorder.mark(F_COLLATE_END, F_CPU_COLLATE_END)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)
