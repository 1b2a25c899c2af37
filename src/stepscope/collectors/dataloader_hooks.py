"""stepscope's hooks into torch's DataLoader iterators, in the program's own process.

While a profile that records DataLoader workers is running (``HUB.acquire()`` ..
``release()``), and from the moment the program has imported ``torch.utils.data``:

- each iterator gets a ``LoaderChannel`` (the loader's settings as the program set them, what
  the loop took); one with worker processes also gets a shared ``Channel`` whose path reaches
  its workers through ``HookedWorkerLoop``, the stand-in for torch's worker loop;
- the iterator's ``_next_data`` notes when the loop asked, ``_get_data`` which task index
  a result carries and when it arrived, ``_process_data`` which worker made the batch the loop
  takes; ``_reset`` counts the epochs of persistent workers;
- ``pin_memory`` notes how long pinning a batch took;
- a loader without workers records each batch it makes in the loop (dataset and collate split).

Outside a window (``armed`` false) each hook costs one attribute test.  Every hook is put back
at ``release`` unless someone wrapped it after us.  A failure inside a hook is counted and
never reaches the program: the iterator's own result or exception is what it would be.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from stepscope.clock import now_ns
from stepscope.collectors import import_watch
from stepscope.collectors.dataloader_ring import (
    F_BATCH,
    F_CPU_END,
    F_CPU_START,
    F_END,
    F_EPOCH,
    F_KIND,
    F_START,
    KIND_BATCH,
    KIND_ERROR,
    RECORD_WORDS,
    Channel,
    Record,
)
from stepscope.collectors.dataloader_worker import (
    HookedWorkerLoop,
    TimedCollate,
    original_loop,
    pending,
)
from stepscope.failures import failure_log

__all__ = ["HUB", "Consumed", "Hub", "LoaderChannel"]

_failures = failure_log("collectors")
ATTR = "_stepscope_loader"
"""The ``LoaderChannel`` of a torch iterator, in its ``__dict__``."""
MAX_CONSUMED = 100_000
"""Batches the loop took that one window keeps per iterator (more are counted as dropped)."""
MAX_PENDING = 4096
"""Results received but not yet taken, and pinned batches, remembered at most."""


class Consumed(NamedTuple):
    """A batch the loop took: which, from which worker (-1: made in the loop), when."""

    epoch: int
    batch: int
    worker: int
    tid: int
    asked_ns: int
    returned_ns: int
    received_ns: int
    """When the result reached the main process (0: unknown, before the window)."""
    pin_ns: int
    kind: int


def _start_method(loader: Any) -> str | None:
    context = getattr(loader, "multiprocessing_context", None)
    getter = getattr(context, "get_start_method", None)
    if callable(getter):
        return str(getter())
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_start_method()


def _settings(loader: Any) -> dict[str, Any]:
    """The loader's options as the program set them."""
    workers = int(loader.num_workers)
    from torch.utils.data import IterableDataset

    init_fn = getattr(loader, "worker_init_fn", None)
    dataset = loader.dataset
    return {
        "num_workers": workers,
        "prefetch_factor": getattr(loader, "prefetch_factor", None) if workers else None,
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "in_order": bool(getattr(loader, "in_order", True)),
        "batch_size": getattr(loader, "batch_size", None),
        "start_method": _start_method(loader) if workers else None,
        "dataset": type(dataset).__qualname__,
        "iterable_dataset": isinstance(dataset, IterableDataset),
        "worker_init_fn": getattr(init_fn, "__qualname__", repr(init_fn)) if init_fn else None,
    }


class LoaderChannel:
    """One iterator of a DataLoader: its settings, its workers' channel, what the loop took."""

    def __init__(self, loader: int, iterator: int, settings: dict[str, Any]) -> None:
        self.loader = loader
        self.iterator = iterator
        self.settings = settings
        workers = int(settings["num_workers"])
        self.ring = Channel(workers) if workers else None
        self.worker_pids: dict[int, int] = {}
        self.epoch = 0
        self.asked_ns = 0
        self.consumed: list[Consumed] = []
        self.consumed_dropped = 0
        self.received: dict[int, tuple[int, int]] = {}
        self.local: list[Record] = []
        """Batches made in the loop (a loader without workers) since the last window took them."""
        self._current: list[int] | None = None
        self.ended = False
        """The iterator is gone; closed once a window has collected it."""

    def arm(self, on: bool) -> None:
        """Workers record their batches (or stop)."""
        if self.ring is not None:
            self.ring.arm(on)

    def took(self, data: Any, worker: int, fallback_batch: int, pin_ns: int, kind: int) -> None:
        """The loop takes ``data``, made by ``worker``."""
        got = self.received.pop(id(data), None)
        batch, received = got if got is not None else (fallback_batch, 0)
        if len(self.consumed) >= MAX_CONSUMED:
            self.consumed_dropped += 1
            return
        self.consumed.append(
            Consumed(
                self.epoch,
                batch,
                worker,
                threading.get_native_id(),
                self.asked_ns,
                now_ns(),
                received,
                pin_ns,
                kind,
            )
        )

    def receive(self, batch: int, data: Any) -> None:
        """A result for task ``batch`` reached the main process."""
        if len(self.received) >= MAX_PENDING:
            self.received.clear()  # results never taken (an iterator left mid-epoch)
        self.received[id(data)] = (batch, now_ns())

    # -- batches made in the loop (no workers) --------------------------------------------
    def local_begin(self, batch: int) -> None:
        """The loop starts making batch ``batch`` itself."""
        self.asked_ns = now = now_ns()
        current = [0] * RECORD_WORDS
        current[F_EPOCH], current[F_BATCH], current[F_START] = self.epoch, batch, now
        current[F_CPU_START] = time.thread_time_ns()
        self._current = current

    @property
    def batch(self) -> int | None:
        """The batch the loop is making now (a loader without workers), if any."""
        current = self._current
        return None if current is None else current[F_BATCH]

    def mark(self, field: int, cpu_field: int) -> None:
        """Collate's start or end inside the batch the loop is making."""
        current = self._current
        if current is not None:
            current[field], current[cpu_field] = now_ns(), time.thread_time_ns()

    def local_end(self, kind: int | None, pin_ns: int = 0) -> None:
        """The batch is made (``kind``), or was not (None: the loader ran out)."""
        current, self._current = self._current, None
        if current is None or kind is None:
            return
        current[F_KIND], current[F_END], current[F_CPU_END] = kind, now_ns(), time.thread_time_ns()
        if len(self.local) >= MAX_CONSUMED:
            self.consumed_dropped += 1
            return
        self.local.append(Record(-1, *current))
        self.took(None, -1, current[F_BATCH], pin_ns, kind)

    def take(self) -> tuple[list[Consumed], list[Record]]:
        """What the loop took (and made) since the last call."""
        consumed, self.consumed = self.consumed, []
        local, self.local = self.local, []
        return consumed, local

    def close(self) -> None:
        """Remove the workers' channel."""
        self.ended = True
        if self.ring is not None:
            self.ring.close()


class Hub:
    """The process's hooks into torch's DataLoader and the channels of its iterators."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.users = 0
        self.armed = False
        self.generation = 0
        """The sampling run of the window in progress (0: none)."""
        self._runs = 0
        self.rate_hz = 100.0
        self.channels: list[LoaderChannel] = []
        self._numbers: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._iterators = 0
        self._undo: list[Callable[[], None]] = []
        self.pinned: dict[int, int] = {}
        """Pinned batch (by id) -> ns spent pinning it (the pin thread writes, the loop takes)."""
        self.strict: bool | None = None

    # -- life -------------------------------------------------------------------------------
    def acquire(self, strict: bool | None = None) -> None:
        """A profile that records DataLoader workers began: hook torch once it is imported."""
        self.users += 1
        self.strict = strict
        if self.users == 1:
            import_watch.when_imported("torch.utils.data", self._install)

    def release(self) -> None:
        """That profile ended: unhook when it was the last.  The channels of iterators that
        are gone are removed; a live iterator keeps its own until it goes (its workers run
        with it), so a later profile (an on-demand window's) follows it again."""
        self.users = max(0, self.users - 1)
        if self.users:
            return
        import_watch.cancel("torch.utils.data", self._install)
        for undo in reversed(self._undo):
            with contextlib.suppress(Exception):
                undo()
        self._undo.clear()
        self.arm(False)
        self.stop_sampling()
        for channel in [c for c in self.channels if c.ended]:
            self._forget(channel)

    def forget_in_child(self) -> None:
        """In a forked child: the channels and windows are the parent's; hook nothing new."""
        self.channels = []
        self.armed, self.generation = False, 0

    def failed(self, where: str, exc: Exception) -> None:
        """A hook failed: counted, logged once; the program goes on."""
        _failures.report(
            "dataloader_hook",
            f"DataLoader workers: {where}",
            exc,
            strict=self.strict,
            then="that batch is not recorded; the program goes on",
            once=("dataloader", where),
        )

    # -- windows ----------------------------------------------------------------------------
    def arm(self, on: bool) -> None:
        """Record batches from now on (prepare) or stop (window end)."""
        self.armed = on
        for channel in list(self.channels):
            channel.arm(on)

    def sample(self, rate_hz: float) -> int:
        """Workers sample their stacks from their next batch on; returns the run's number."""
        self._runs += 1
        self.generation, self.rate_hz = self._runs, rate_hz
        for channel in list(self.channels):
            if channel.ring is not None:
                channel.ring.sample(self.generation, rate_hz)
        return self.generation

    def stop_sampling(self) -> None:
        """Workers write their samples (each acknowledges in its region)."""
        self.generation = 0
        for channel in list(self.channels):
            if channel.ring is not None:
                channel.ring.sample(0, self.rate_hz)

    def collected(self, channel: LoaderChannel) -> None:
        """A window took what it needed of an iterator that is gone: remove its channel."""
        if channel.ended:
            self._forget(channel)

    def _forget(self, channel: LoaderChannel) -> None:
        with contextlib.suppress(ValueError):  # a finalizer on another thread was first
            self.channels.remove(channel)
        channel.close()

    # -- iterators --------------------------------------------------------------------------
    def new_channel(self, iterator: Any, loader: Any) -> LoaderChannel | None:
        """A channel for an iterator being built (None: not recording here)."""
        if not self.users or os.getpid() != self.pid:
            return None
        try:
            number = self._numbers.get(loader)
            if number is None:
                number = self._numbers[loader] = len(self._numbers) + 1
            self._iterators += 1
            channel = LoaderChannel(number, self._iterators, _settings(loader))
            channel.arm(self.armed)
            if channel.ring is not None and self.generation:
                channel.ring.sample(self.generation, self.rate_hz)
        except Exception as exc:
            self.failed("a new iterator", exc)
            return None
        iterator.__dict__[ATTR] = channel
        self.channels.append(channel)
        weakref.finalize(iterator, self._iterator_gone, channel)
        return channel

    def _iterator_gone(self, channel: LoaderChannel) -> None:
        channel.ended = True
        if not self.armed:  # no window wants its records
            self._forget(channel)

    # -- the hooks --------------------------------------------------------------------------
    def _install(self) -> None:
        """Wrap torch's iterators, worker loop and pin_memory (called once torch is there); a
        torch whose DataLoader differs is left alone, whole."""
        if not self.users or os.getpid() != self.pid:
            return
        try:
            self._install_hooks()
        except Exception as exc:
            for undo in reversed(self._undo):
                with contextlib.suppress(Exception):
                    undo()
            self._undo.clear()
            self.failed("hooking torch's DataLoader", exc)

    def _install_hooks(self) -> None:
        from torch.utils.data import dataloader
        from torch.utils.data._utils import pin_memory as pinning
        from torch.utils.data._utils import worker

        multi: Any = dataloader._MultiProcessingDataLoaderIter
        single: Any = dataloader._SingleProcessDataLoaderIter
        self._wrap(multi, "__init__", self._multi_init)
        self._wrap(multi, "_reset", self._reset)
        self._wrap(multi, "_get_data", self._get_data)
        self._wrap(multi, "_next_data", self._multi_next)
        self._wrap(multi, "_process_data", self._process_data)
        self._wrap(single, "__init__", self._single_init)
        self._wrap(single, "_next_data", self._single_next)
        self._wrap(pinning, "pin_memory", self._pin, module=True)
        loop = worker._worker_loop
        if not isinstance(loop, HookedWorkerLoop):
            original_loop[:] = [loop]
            hooked = HookedWorkerLoop()
            worker._worker_loop = hooked

            def unhook() -> None:
                if worker._worker_loop is hooked:
                    worker._worker_loop = loop
                    original_loop.clear()

            self._undo.append(unhook)

    def _wrap(
        self,
        owner: Any,
        name: str,
        make: Callable[[Callable[..., Any]], Callable[..., Any]],
        module: bool = False,
    ) -> None:
        original = getattr(owner, name) if module else owner.__dict__[name]
        wrapper = make(original)
        wrapper.__name__, wrapper.__qualname__ = name, getattr(original, "__qualname__", name)
        wrapper.__doc__ = original.__doc__
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, name, wrapper)

        def restore() -> None:
            current = getattr(owner, name) if module else owner.__dict__.get(name)
            if current is wrapper:  # unless someone wrapped it after us
                setattr(owner, name, original)

        self._undo.append(restore)

    def _multi_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hub = self

        def __init__(it: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
            channel = hub.new_channel(it, loader)
            if channel is None or channel.ring is None:
                original(it, loader, *args, **kwargs)
                return
            previous = getattr(pending, "path", None)
            pending.path = channel.ring.path  # read by HookedWorkerLoop as each worker starts
            try:
                original(it, loader, *args, **kwargs)
            finally:
                pending.path = previous
            try:
                channel.worker_pids = {i: int(w.pid) for i, w in enumerate(it._workers)}
                channel.settings["pin_memory_used"] = bool(getattr(it, "_pin_memory", False))
            except Exception as exc:
                hub.failed("the iterator's workers", exc)

        return __init__

    def _reset(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def _reset(it: Any, loader: Any, *args: Any, **kwargs: Any) -> Any:
            channel = it.__dict__.get(ATTR)
            first = kwargs.get("first_iter", args[0] if args else False)
            if channel is not None and not first:
                channel.epoch += 1  # persistent workers: torch resumes them for a new epoch
            return original(it, loader, *args, **kwargs)

        return _reset

    def _get_data(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hub = self

        def _get_data(it: Any) -> Any:
            result = original(it)
            if hub.armed:
                channel = it.__dict__.get(ATTR)
                try:
                    if channel is not None and type(result[0]) is int:
                        channel.receive(result[0], result[1])
                except Exception as exc:
                    hub.failed("a result received", exc)
            return result

        return _get_data

    def _multi_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hub = self

        def _next_data(it: Any) -> Any:
            if hub.armed:
                channel = it.__dict__.get(ATTR)
                if channel is not None:
                    channel.asked_ns = now_ns()
            return original(it)

        return _next_data

    def _process_data(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hub = self

        def _process_data(it: Any, data: Any, worker_idx: Any, *args: Any, **kwargs: Any) -> Any:
            if hub.armed:
                channel = it.__dict__.get(ATTR)
                if channel is not None:
                    try:
                        in_order = getattr(it, "_in_order", True)
                        fallback = it._rcvd_idx - 1 if in_order else -1
                        kind = KIND_ERROR if type(data).__name__ == "ExceptionWrapper" else 0
                        pin = hub.pinned.pop(id(data), 0)
                        channel.took(data, int(worker_idx), fallback, pin, kind)
                    except Exception as exc:
                        hub.failed("a batch taken", exc)
            return original(it, data, worker_idx, *args, **kwargs)

        return _process_data

    def _single_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hub = self

        def __init__(it: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
            original(it, loader, *args, **kwargs)
            channel = hub.new_channel(it, loader)
            if channel is None:
                return
            try:
                fetcher = it._dataset_fetcher
                fetcher.collate_fn = TimedCollate(fetcher.collate_fn, channel)
            except Exception as exc:
                hub.failed("a loader without workers", exc)

        return __init__

    def _single_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hub = self

        def _next_data(it: Any) -> Any:
            channel = it.__dict__.get(ATTR) if hub.armed else None
            if channel is None:
                return original(it)
            try:
                channel.local_begin(int(it._num_yielded))
            except Exception as exc:
                hub.failed("a batch made in the loop", exc)
                return original(it)
            kind: int | None = KIND_ERROR
            pin = 0
            try:
                data = original(it)
                kind, pin = KIND_BATCH, hub.pinned.pop(id(data), 0)
                return data
            except StopIteration:
                kind = None
                raise
            finally:
                try:
                    channel.local_end(kind, pin)
                except Exception as exc:
                    hub.failed("a batch made in the loop", exc)

        return _next_data

    def _pin(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hub, state = self, threading.local()

        def pin_memory(data: Any, *args: Any, **kwargs: Any) -> Any:
            if not hub.armed or getattr(state, "inside", False):  # its own nested calls
                return original(data, *args, **kwargs)
            state.inside = True
            start = now_ns()
            try:
                pinned = original(data, *args, **kwargs)
            finally:
                state.inside = False
            pins = hub.pinned
            if len(pins) >= MAX_PENDING:
                pins.clear()
            pins[id(pinned)] = now_ns() - start
            return pinned

        return pin_memory


HUB = Hub()
"""The one hub of this process."""
