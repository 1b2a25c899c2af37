"""The DataLoader workers collector: each batch from the worker that made it, in the trace.

While the profile runs, ``dataloader_hooks.HUB`` follows every DataLoader iterator (see
there).  From a window's prepare to its stop the workers record their batches and the loop
what it takes; from its start they also sample their stacks.  At collect each batch is a
span on its worker's track (``trace.worker_tracks``: ``batch N`` with ``dataset`` and
``collate`` inside), each batch the loop took an instant on the asking thread with a flow from
the batch, the workers' samples join the trace's samples on their tracks, and the loaders'
settings go to the metadata (``stepscope_dataloaders``).

A window keeps the batches that overlap it and those made earlier (from its warm-up on) that
the loop took in it; a batch still in progress at the end is cut there and flagged, as is the
batch of a worker that died.  Waiting for the workers' samples is bounded (``ACK_TIMEOUT_S``)
and stops at once for a worker that is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from collections import deque
from typing import Any

from stepscope.collectors.base import Collector, WindowContext
from stepscope.collectors.dataloader_hooks import HUB, Consumed, LoaderChannel
from stepscope.collectors.dataloader_ring import (
    KIND_END,
    KIND_ERROR,
    R_ACK,
    R_ERRORS,
    R_EXITED,
    R_PID,
    R_SAMPLING,
    Record,
    samples_file,
)
from stepscope.extras import torch_installed
from stepscope.trace.model import TraceBuilder
from stepscope.trace.names import is_hidden
from stepscope.trace.worker_tracks import (
    BATCH_PREFIX,
    COLLATE_SPAN,
    CONSUMED_INSTANT,
    DATASET_SPAN,
    EXITED_INSTANT,
    LOOP_TRACK_BASE,
    METADATA_KEY,
    WORKER_CATEGORY,
)

__all__ = ["DataLoaderWorkersCollector", "collectors_for"]

OPEN_FLAG = "stepscope.open_at_window_end"
ACK_TIMEOUT_S = 2.0
"""Longest wait at a window's end for the workers' samples (a dead worker is not waited for)."""
RECENT_RECORDS = 8192
"""Records kept per iterator between windows (a batch made in one, taken in the next)."""
FLOW_BASE = 1 << 52
"""Flow ids of batch -> loop arrows start here (clear of Kineto's correlation ids)."""
_KINDS = {KIND_ERROR: "error", KIND_END: "end"}


def collectors_for(on: bool, sampling_rate_hz: float) -> list[Collector]:
    """What a profile adds: the collector, when asked for and torch is installed."""
    return [DataLoaderWorkersCollector(sampling_rate_hz)] if on and torch_installed() else []


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


class DataLoaderWorkersCollector(Collector):
    """Each batch a DataLoader worker made, and which step took it (``dataloader_workers``)."""

    name = "dataloader_workers"

    def __init__(self, sampling_rate_hz: float = 100.0) -> None:
        self.rate_hz = sampling_rate_hz
        self._begun = False
        self._generation = 0
        self._taken: list[tuple[LoaderChannel, list[Consumed], list[Record]]] = []
        self._recent: dict[int, deque[Record]] = {}
        self._flows = 0
        self._closing = False
        """Closed with a window still to collect: the hooks go once it is collected."""

    def begin(self) -> None:
        """The profile starts: follow DataLoader iterators from now on (workers start early)."""
        if not self._begun:
            self._begun = True
            HUB.acquire(self.strict)
            # loaded here once, so that forked workers do not each import it to sample
            import stepscope.collectors.sampler  # noqa: F401

    def prepare(self, ctx: WindowContext) -> None:
        """Workers record their batches from here (the warm-up's batches feed the window)."""
        self.begin()
        HUB.arm(True)

    def start(self, ctx: WindowContext) -> None:
        """Workers sample their stacks from their next batch."""
        HUB.arm(True)
        self._generation = HUB.sample(self.rate_hz)

    def stop(self, ctx: WindowContext) -> None:
        """Workers stop recording and write their samples; take what the loop took."""
        HUB.stop_sampling()
        HUB.arm(False)
        self._taken = [(c, *c.take()) for c in list(HUB.channels)]

    def collect(self, builder: TraceBuilder, ctx: WindowContext) -> None:
        """Append the window's batches, what the loop took, and the workers' samples."""
        taken, self._taken = self._taken, []
        generation, self._generation = self._generation, 0
        interrupted = _wait_for_samples([c for c, _, _ in taken], generation)
        if interrupted is not None:
            ctx.summary.append(
                "DataLoader: the program's signal handler raised while the workers' samples "
                f"were awaited ({type(interrupted).__name__}: {interrupted}); the loop gets it "
                "from its iterator"
            )
        loaders = []
        for channel, consumed, local in taken:
            entry = self._add_channel(builder, ctx, channel, consumed, local, generation)
            if entry is not None:
                loaders.append(entry)
            HUB.collected(channel)
            if channel.ended:
                self._recent.pop(channel.iterator, None)
        if loaders:
            ctx.metadata[METADATA_KEY] = loaders
        if self._closing:
            self._closing = False
            self._release()

    def close(self) -> None:
        """The profile ended: unhook (the last profile to do so removes every channel) — after
        the last window's collect, should that come later."""
        if self._taken:
            self._closing = True
        else:
            self._release()

    def _release(self) -> None:
        if self._begun:
            self._begun = False
            self._recent.clear()
            HUB.release()

    def after_fork_in_child(self) -> None:
        """In a forked child (a worker, or any other): the parent's iterators are not ours."""
        self._taken = []
        self._recent.clear()
        self._begun = False
        HUB.forget_in_child()

    # -- one iterator -----------------------------------------------------------------------
    def _add_channel(
        self,
        builder: TraceBuilder,
        ctx: WindowContext,
        channel: LoaderChannel,
        consumed: list[Consumed],
        local: list[Record],
        generation: int,
    ) -> dict[str, Any] | None:
        start, end = ctx.start_ns, ctx.end_ns or ctx.stopping_ns
        recent = self._recent.setdefault(channel.iterator, deque(maxlen=RECENT_RECORDS))
        ring = channel.ring
        open_now: list[Record] = []
        if ring is not None:
            for worker in range(ring.workers):
                current = ring.in_progress(worker)  # first: one finished meanwhile is read next
                done = ring.read(worker)
                recent.extend(done)
                if current is not None and (current.epoch, current.batch) not in {
                    (r.epoch, r.batch) for r in done[-1:]
                }:
                    open_now.append(current)
        recent.extend(local)
        taken = [c for c in consumed if start <= c.asked_ns < end]
        wanted = {(c.worker, c.epoch, c.batch) for c in taken}
        records = [
            r
            for r in recent
            if (r.start_ns < end and r.end_ns > start) or (r.worker, r.epoch, r.batch) in wanted
        ]
        records += [r for r in open_now if r.start_ns < end]
        if not records and not taken:
            return None
        pid = ctx.pid
        tracks = self._name_tracks(builder, pid, channel)
        made: dict[tuple[int, int, int], tuple[int, int]] = {}
        for r in records:
            tid = tracks[r.worker]
            made[(r.worker, r.epoch, r.batch)] = (
                tid,
                _add_batch(builder, pid, tid, r, end, channel),
            )
        for c in taken:
            self._add_taken(builder, pid, channel, c, made.get((c.worker, c.epoch, c.batch)))
        workers = []
        if ring is not None:
            for worker in range(ring.workers):
                worker_pid = ring.worker_word(worker, R_PID) or channel.worker_pids.get(worker, 0)
                info: dict[str, Any] = {"worker": worker, "pid": worker_pid}
                if worker_pid and not _alive(worker_pid):
                    info["exited"] = True
                errors = ring.worker_word(worker, R_ERRORS)
                if errors:
                    info["recorder_errors"] = errors
                left = ring.worker_word(worker, R_EXITED)
                if start <= left < end:
                    builder.instant(EXITED_INSTANT, WORKER_CATEGORY, pid, tracks[worker], left)
                sampled = _add_samples(
                    builder, ring, worker, worker_pid, pid, generation, start, end
                )
                if sampled is not None:
                    info["sampler"] = sampled
                workers.append(info)
        entry: dict[str, Any] = {
            "loader": channel.loader,
            "iterator": channel.iterator,
            **channel.settings,
            "workers": workers,
            "batches": len(records),
            "taken": len(taken),
        }
        dropped = (ring.dropped if ring is not None else 0) + channel.consumed_dropped
        if dropped:
            entry["dropped"] = dropped
            ctx.summary.append(f"DataLoader {channel.loader}: {dropped} batch records dropped")
        return entry

    def _name_tracks(
        self, builder: TraceBuilder, pid: int, channel: LoaderChannel
    ) -> dict[int, int]:
        tracks: dict[int, int] = {-1: LOOP_TRACK_BASE + channel.loader}
        ring = channel.ring
        if ring is None:
            builder.thread_name(
                pid,
                tracks[-1],
                f"DataLoader {channel.loader}: batches made in the loop (num_workers=0)",
            )
            return tracks
        for worker in range(ring.workers):
            worker_pid = ring.worker_word(worker, R_PID) or channel.worker_pids.get(worker, 0)
            tracks[worker] = worker_pid or (LOOP_TRACK_BASE + 1000 * channel.loader + worker)
            builder.thread_name(
                pid,
                tracks[worker],
                f"DataLoader {channel.loader} worker {worker} (pid {worker_pid})",
            )
        return tracks

    def _add_taken(
        self,
        builder: TraceBuilder,
        pid: int,
        channel: LoaderChannel,
        c: Consumed,
        made: tuple[int, int] | None,
    ) -> None:
        args: dict[str, Any] = {
            "loader": channel.loader,
            "iterator": channel.iterator,
            "epoch": c.epoch,
            "batch": c.batch,
            "worker": c.worker,
            "wait_ns": max(0, c.returned_ns - c.asked_ns),
        }
        if c.received_ns:
            args["received_before_ask_ns"] = c.asked_ns - c.received_ns
        if c.pin_ns:
            args["pin_ns"] = c.pin_ns
        if c.kind:
            args["kind"] = _KINDS.get(c.kind, str(c.kind))
        builder.instant(CONSUMED_INSTANT, WORKER_CATEGORY, pid, c.tid, c.asked_ns, "t", args)
        if made is not None:
            tid, at = made
            self._flows += 1
            flow = FLOW_BASE + self._flows
            builder.flow(CONSUMED_INSTANT, WORKER_CATEGORY, pid, tid, at, flow, "s")
            builder.flow(
                CONSUMED_INSTANT, WORKER_CATEGORY, pid, c.tid, c.returned_ns, flow, "f", "e"
            )


def _add_batch(
    builder: TraceBuilder, pid: int, tid: int, r: Record, end: int, channel: LoaderChannel
) -> int:
    """A batch's spans; returns a time inside the batch span for the flow to the loop."""
    finished = r.end_ns if 0 < r.end_ns <= end else 0
    stop = finished or end
    args: dict[str, Any] = {
        "loader": channel.loader,
        "iterator": channel.iterator,
        "worker": r.worker,
        "epoch": r.epoch,
        "batch": r.batch,
        "dataset_ns": max(0, min(r.dataset_end_ns or stop, stop) - r.start_ns),
        "dataset_cpu_ns": r.dataset_cpu_ns if finished or r.collate_start_ns else 0,
    }
    if r.collate_start_ns and r.collate_end_ns and r.collate_end_ns <= stop:
        args["collate_ns"] = r.collate_end_ns - r.collate_start_ns
        args["collate_cpu_ns"] = r.collate_cpu_ns
    if r.kind:
        args["kind"] = _KINDS.get(r.kind, str(r.kind))
    if not finished:
        args[OPEN_FLAG] = True
    name = "end of the dataset" if r.kind == KIND_END else f"{BATCH_PREFIX}{r.batch}"
    builder.span(name, WORKER_CATEGORY, pid, tid, r.start_ns, stop - r.start_ns, args)
    if r.kind != KIND_END:
        dataset_end = min(r.dataset_end_ns or stop, stop)
        builder.span(DATASET_SPAN, WORKER_CATEGORY, pid, tid, r.start_ns, dataset_end - r.start_ns)
        if r.collate_start_ns and r.collate_start_ns < stop:
            collate_end = min(r.collate_end_ns or stop, stop)
            builder.span(
                COLLATE_SPAN,
                WORKER_CATEGORY,
                pid,
                tid,
                r.collate_start_ns,
                collate_end - r.collate_start_ns,
            )
    return max(r.start_ns, stop - 1)


def _wait_for_samples(channels: list[LoaderChannel], generation: int) -> Exception | None:
    """Wait (bounded) until every live worker that sampled run ``generation`` wrote it.

    A worker that dies while the loop's thread waits here makes torch's SIGCHLD handler raise
    here; that error is the program's (the loop gets it again from its iterator), so the wait
    ends and it is returned, not taken for a failure of the collector."""
    try:
        _wait(channels, generation)
    except Exception as exc:
        frames = traceback.walk_tb(exc.__traceback__)
        if any(not is_hidden(frame.f_code.co_filename) for frame, _ in frames):
            return exc  # raised by someone else's code: a signal handler of the program's
        raise
    return None


def _wait(channels: list[LoaderChannel], generation: int) -> None:
    if not generation:
        return
    deadline = time.monotonic() + ACK_TIMEOUT_S
    waiting = [
        (c.ring, w)
        for c in channels
        if c.ring is not None and not c.ring.closed
        for w in range(c.ring.workers)
    ]
    while waiting and time.monotonic() < deadline:
        waiting = [
            (ring, w)
            for ring, w in waiting
            if ring.worker_word(w, R_SAMPLING) == generation
            and ring.worker_word(w, R_ACK) != generation
            and _alive(ring.worker_word(w, R_PID))
        ]
        if waiting:
            time.sleep(0.002)


def _add_samples(
    builder: TraceBuilder,
    ring: Any,
    worker: int,
    worker_pid: int,
    pid: int,
    generation: int,
    start: int,
    end: int,
) -> dict[str, Any] | None:
    """The worker's samples of run ``generation`` on its track; its sampler's description."""
    if not generation or ring.worker_word(worker, R_SAMPLING) != generation:
        return None
    path = samples_file(ring.directory, worker, generation)
    try:
        with open(path, "rb") as file:
            payload = json.loads(file.read())
    except (OSError, ValueError):
        return {"missing": "the worker wrote no samples (it exited or was too slow to)"}
    with contextlib.suppress(OSError):
        os.unlink(path)
    frames = [builder.frame(str(n), str(f), int(line)) for n, f, line in payload["frames"]]
    paths: list[list[int]] = []
    stacks: list[int] = []
    for parent, frame in zip(payload["stack_parent"], payload["stack_frame"], strict=True):
        path_ = (paths[parent] if parent >= 0 else []) + [frames[frame]]
        paths.append(path_)
        stacks.append(builder.stack(path_))
    kept = 0
    for ts, stack, idle in zip(payload["ts_ns"], payload["stack"], payload["idle"], strict=True):
        if start <= ts < end:
            builder.sample(pid, worker_pid, ts, stacks[stack] if stack >= 0 else -1, 1, bool(idle))
            kept += 1
    info: dict[str, Any] = dict(payload.get("info") or {})
    info["samples_in_window"] = kept
    return info
