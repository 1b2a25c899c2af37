"""Memory per step (``profile_memory``): the Python heap, torch's tensors and the RSS.

By default the Python heap is counted by the C allocation hook (``memory_sampled.py``): exact
totals per step, sites from byte samples; tracemalloc is not touched.  With
``profile_memory="exact"`` (or without the hook: the pure-Python twins, Python < 3.11) it is
measured with ``tracemalloc``, started for the recording window only (a
program that already traces keeps its tracing as it was). At each step end the collector takes a
snapshot (grouped by allocating line, stepscope's own allocations left out), and a watcher thread
polls the traced total every few milliseconds, taking a snapshot whenever the window reaches a
new high: that snapshot is the "alive at the peak" table. torch's tensors come from torch's own
``[memory]`` events (the torch collector records them with ``profile_memory``); per step they are
summed here and drawn as one counter track per device.
"""

from __future__ import annotations

import ast
import functools
import os
import sys
import sysconfig
import threading
import tracemalloc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepscope import clock, steps
from stepscope.collectors import optimizer_hook
from stepscope.collectors.base import Collector, WindowContext
from stepscope.collectors.memory_sampled import SampledHeap, sampling_error_note, unavailable_reason
from stepscope.failures import failure_log
from stepscope.rss import RssReader
from stepscope.trace.memory_fields import (
    BY_MODULE_KEY,
    MEMORY_INSTANT,
    MEMORY_KEY,
    PYTHON_HEAP_TRACK,
    RSS_TRACK,
    StepMemoryRow,
    tensor_events,
    thin_points,
)
from stepscope.trace.model import Trace, TraceBuilder
from stepscope.trace.names import hide_thread, short_path

__all__ = ["MemoryCollector", "PythonHeapPoint", "function_at", "module_of", "module_points"]

_failures = failure_log("collectors")
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARY_DIRS = tuple(
    {
        p.rstrip(os.sep) + os.sep
        for k in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_path(k))
    }
)
TRACEMALLOC_FRAMES = 1
"""Frames kept per allocation when stepscope starts tracemalloc: each more frame makes every
allocation dearer (2 frames: about 1.6x the cost of 1, 5 frames: 3.4x). With more frames (a
program that traces with its own limit), sites are the innermost frame of the program's own code,
above any library's."""
PEAK_TABLE_ROWS = 25
SNAPSHOT_SHARE = 0.03
"""Snapshots of each kind may take at most this share of the window's time."""
CHEAP_SNAPSHOT_NS = 20_000_000
"""A snapshot this quick is taken at the first step ends and the last whatever the budget."""
OVER_BUDGET_CAP = 3
"""Past the budget, a step's settled high is still snapshotted while within this many budgets."""
STEP_END, NEW_HIGH = 0, 1
SITE_CHANGES = 10
"""Sites kept per step: those whose held bytes changed most since the last snapshot."""
MAX_TIMELINE_POINTS = 4000
UNSAMPLED = "(no sample)"
"""The module of bytes held when no sampled allocation was alive to name their module."""
Sites = dict[tuple[str, int], tuple[int, int]]
"""(file, line) -> (bytes, blocks) held."""


@dataclass
class PythonHeapPoint:
    """One snapshot of the Python heap: its time and bytes held by allocating site."""

    t_ns: int
    sites: Sites
    total: int | None = None
    """The exact bytes held, when the sites are estimates from samples (they scale to it)."""


@dataclass
class _Window:
    started_tracing: bool = False
    step: int = 0
    step_start_ns: int = 0
    step_peak: int = 0
    own: int = 0
    rows: list[StepMemoryRow] = field(default_factory=list)
    ends: list[PythonHeapPoint] = field(default_factory=list)
    peak: PythonHeapPoint | None = None
    """The snapshot holding the most, for the peak table."""
    peak_total: int = 0
    peak_step: int = 0
    peak_bytes: int = 0
    """The highest step peak of the window."""
    timeline: list[tuple[int, int]] = field(default_factory=list)
    rss: list[tuple[int, int]] = field(default_factory=list)
    window_start_ns: int = 0
    snapshot_ns: list[int] = field(default_factory=lambda: [0, 0])
    """Time spent taking snapshots at step ends and at new highs (each under its share)."""
    skipped_snapshots: int = 0
    site_ids: dict[tuple[str, int], int] = field(default_factory=dict)
    """Allocation sites named by the per-step changes, interned (the metadata's ``sites``)."""
    watch_error: str = ""
    last_snapshot_ns: int = 0
    """How long the last snapshot took."""
    last_snapshot_traced: int = 0
    """The bytes tracemalloc traced then (the next snapshot's cost grows with them)."""
    last_held: int = 0
    high_step: int = -1
    """The step of the last snapshot at a new high."""
    heap: SampledHeap | None = None
    rss_reader: RssReader = field(default_factory=RssReader)
    """The allocation hook, when it counts the heap (else tracemalloc does)."""
    hook_fallback: str = ""
    tracing_lost_step: int | None = None
    """The first step end at which the program had stopped tracemalloc (exact mode)."""


@functools.lru_cache(maxsize=4096)
def _is_library(file: str) -> bool:
    return file.startswith(_LIBRARY_DIRS) or file.startswith("<frozen")


def _snapshot_sites() -> tuple[Sites, int]:
    """Bytes held by allocating site: the innermost frame in the program's own code.

    Reads tracemalloc's raw traces (what ``take_snapshot`` wraps), grouped by traceback first:
    many allocations share one, so each is resolved to a site once.
    """
    by_traceback: dict[Any, list[int]] = {}
    raw: Any = tracemalloc._get_traces()  # type: ignore[attr-defined]
    for trace in raw:  # (domain, size, frames newest first, ...)
        group = by_traceback.get(trace[2])
        if group is None:
            by_traceback[trace[2]] = [trace[1], 1]
        else:
            group[0] += trace[1]
            group[1] += 1
    sites: Sites = {}
    total = 0
    for frames, (size, count) in by_traceback.items():
        if not frames:
            continue
        chosen = frames[0]
        for frame in frames:
            if not _is_library(frame[0]):
                chosen = frame
                break
        if chosen[0].startswith(_OWN_DIR) or chosen[0] == tracemalloc.__file__:
            continue  # stepscope's own bookkeeping, not the program's
        key = (chosen[0], chosen[1])
        held, blocks = sites.get(key, (0, 0))
        sites[key] = (held + size, blocks + count)
        total += size
    return sites, total


@functools.lru_cache(maxsize=512)
def _functions_in(file: str) -> tuple[tuple[int, int, str], ...]:
    try:
        with open(file, "rb") as f:
            tree = ast.parse(f.read(), file)
    except (OSError, SyntaxError, ValueError):
        return ()
    found: list[tuple[int, int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found.append((child.lineno, child.end_lineno or child.lineno, name))
                walk(child, f"{name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return tuple(found)


def function_at(file: str, line: int) -> str:
    """The qualified name of the innermost function holding ``file:line`` (``<module>`` else)."""
    best = "<module>"
    best_span = None
    for first, last, name in _functions_in(file):
        if first <= line <= last and (best_span is None or last - first <= best_span):
            best, best_span = name, last - first
    return best


def module_of(file: str) -> str:
    """The top-level module a source file belongs to (its first path part on ``sys.path``)."""
    short = short_path(file)
    if os.path.isabs(short) or short.startswith("<"):
        return os.path.splitext(os.path.basename(short))[0] or short
    first = short.split(os.sep, 1)[0]
    return first[:-3] if first.endswith(".py") else first


def module_points(points: Sequence[PythonHeapPoint]) -> dict[str, Any]:
    """The snapshots' bytes by top-level allocating module (sampled shares scaled to the exact
    total), in time order: ``{"modules": [...], "points": [[t_ns, bytes per module...]]}``,
    the modules in the order they first held memory (``memory_fields.heap_by_module`` reads it).
    """
    modules: dict[str, None] = {}
    module_of_file: dict[str, str] = {}
    rows: list[tuple[int, dict[str, int]]] = []
    for point in sorted(points, key=lambda p: p.t_ns):
        held: dict[str, int] = {}
        for (file, _line), (size, _count) in point.sites.items():
            module = module_of_file.get(file)
            if module is None:
                module = module_of_file[file] = module_of(file)
            held[module] = held.get(module, 0) + size
        held = _scaled(held, point.total)
        modules.update(dict.fromkeys(held))
        rows.append((point.t_ns, held))
    return {
        "modules": list(modules),
        "points": [[t, *(held.get(m, 0) for m in modules)] for t, held in rows],
    }


def _scaled(held: dict[str, int], total: int | None) -> dict[str, int]:
    """Sampled shares scaled to the exact total held (the remainder to the biggest module)."""
    if total is None:
        return held
    sampled = sum(held.values())
    if sampled <= 0:
        return {UNSAMPLED: total} if total > 0 else {}
    out = {module: size * total // sampled for module, size in held.items()}
    biggest = max(out, key=lambda m: out[m])
    out[biggest] += total - sum(out.values())
    return out


def site_rows(sites: Sites, top: int) -> list[dict[str, Any]]:
    """The biggest sites of a snapshot, with the function that allocated them."""
    ordered = sorted(sites.items(), key=lambda item: -item[1][0])[:top]
    return [
        {
            "function": function_at(file, line),
            "file": short_path(file),
            "line": line,
            "bytes": size,
            "count": count,
        }
        for (file, line), (size, count) in ordered
    ]


class MemoryCollector(Collector):
    """Per-step memory of the Python heap, torch's tensors and the process (``profile_memory``)."""

    name = "memory"

    def __init__(
        self, torch_collector: Any = None, poll_interval_s: float = 0.005, exact: bool = False
    ) -> None:
        self.torch_collector = torch_collector
        """The torch collector whose window result holds torch's memory events, if any."""
        self.exact = exact
        """Every allocation through tracemalloc (``profile_memory="exact"``), not sampled sites."""
        self.poll_interval_s = poll_interval_s
        self._window: _Window | None = None
        self._lock = threading.Lock()
        self._stop_watch = threading.Event()
        self._watcher: threading.Thread | None = None
        self._watcher_id: int | None = None
        self._optimizer_hook = False
        optimizer_hook.ensure_registered()  # now: no hook loop runs while a profile is built
        self.optimizers: dict[int, Any] = {}
        """Optimizers stepped in the last window, by id (their state names tensor categories)."""
        self.torch_result: Any = None
        """torch's ``autograd.profiler.profile`` of the last window, when torch recorded."""

    # -- the window --------------------------------------------------------------------------
    def start(self, ctx: WindowContext) -> None:
        """Start the allocation hook (or tracemalloc), the watcher and the optimizer hook."""
        w = self._window = _Window()
        self.optimizers = {}
        reason = "profile_memory='exact'" if self.exact else unavailable_reason()
        if reason is None:
            heap = SampledHeap(_OWN_DIR, _is_library)
            try:
                heap.start(seed=os.getpid())
                w.heap = heap
            except RuntimeError as exc:  # another profile's window holds the hook
                reason = str(exc)
        if reason is not None:
            w.hook_fallback = reason
            if not tracemalloc.is_tracing():
                tracemalloc.start(TRACEMALLOC_FRAMES)
                w.started_tracing = True
        step = steps.current_step()
        w.step = step if step is not None else 0
        w.window_start_ns = clock.now_ns()
        self._begin_step(w, clock.now_ns())
        self._hook_optimizers()
        if self.poll_interval_s > 0:
            self._stop_watch.clear()
            self._watcher = threading.Thread(
                target=self._watch, name="stepscope-memory", daemon=True
            )
            self._watcher.start()
            self._watcher_id = self._watcher.native_id
            hide_thread(self._watcher_id)

    def _begin_step(self, w: _Window, now: int, rss: int | None = None) -> None:
        """Open a step; ``rss`` is the resident size the step that just ended read, if any."""
        if w.heap is not None:  # the hook counts from zero: nothing before the window
            if not w.ends:
                w.ends.append(PythonHeapPoint(now, {}))
            w.step_start_ns, w.step_peak = now, 0
            self._note_rss(w, now, rss)
            return
        if not w.ends:  # the window's start: what was held before it
            sites, total = self._snapshot(w, STEP_END)
            w.own = max(tracemalloc.get_traced_memory()[0] - total, 0)
            w.ends.append(PythonHeapPoint(now, sites))
        if w.started_tracing:  # a program's own tracing keeps its peak
            tracemalloc.reset_peak()
        w.step_start_ns, w.step_peak = now, 0
        self._note_rss(w, now, rss)

    @staticmethod
    def _snapshot(w: _Window, kind: int) -> tuple[Sites, int]:
        begin = clock.now_ns()
        found = _snapshot_sites()
        w.last_snapshot_ns = clock.now_ns() - begin
        w.last_snapshot_traced = tracemalloc.get_traced_memory()[0]
        w.snapshot_ns[kind] += w.last_snapshot_ns
        return found

    @staticmethod
    def _next_snapshot_ns(w: _Window) -> int:
        """What the next snapshot should cost (the last one's, scaled by the bytes traced) when
        the last was dear; 0 else (small heaps keep every snapshot the budget allows)."""
        if w.last_snapshot_ns < CHEAP_SNAPSHOT_NS // 4:  # too quick to scale from
            return 0
        traced = tracemalloc.get_traced_memory()[0]
        return w.last_snapshot_ns * traced // max(w.last_snapshot_traced, 1)

    @staticmethod
    def _affordable(w: _Window, now: int, kind: int) -> bool:
        """Snapshots cost time proportional to the live blocks: keep each kind (step ends,
        new highs) to a share of the window's time; the first few step ends, and the last, are
        taken anyway while a snapshot is cheap (a big heap's are not: each copies every trace)."""
        if kind == STEP_END and len(w.ends) <= 3 and w.last_snapshot_ns <= CHEAP_SNAPSHOT_NS:
            return True
        spent = w.snapshot_ns[kind] + MemoryCollector._next_snapshot_ns(w)
        return spent <= SNAPSHOT_SHARE * (now - w.window_start_ns)

    @staticmethod
    def _note_rss(w: _Window, now: int, rss: int | None = None) -> None:
        if rss is None:
            rss = w.rss_reader.read()
        if rss is not None:
            w.rss.append((now, rss))

    def on_step(self, ctx: WindowContext, step: int) -> None:
        """Close the step that ended: its current and peak, a snapshot of what it left held."""
        w = self._window
        if w is not None:
            with self._lock:
                rss = self._end_step(w, clock.now_ns())
                w.step = step
                self._begin_step(w, clock.now_ns(), rss)

    def _end_step(self, w: _Window, now: int, last: bool = False) -> int | None:
        """Close the step: its row; returns the resident size read for it (None if none)."""
        rss = w.rss_reader.read()  # first: the step's own size, before our work at its end
        if w.heap is not None:
            self._end_sampled_step(w, w.heap, now, rss)
            return rss
        if not tracemalloc.is_tracing():  # the program stopped it: nothing to read
            if w.tracing_lost_step is None:
                w.tracing_lost_step = w.step
            w.rows.append(StepMemoryRow(w.step, w.step_start_ns, now))
            return rss
        current, peak = tracemalloc.get_traced_memory()
        step_peak = max(w.step_peak, (peak if w.started_tracing else current) - w.own)
        changes: tuple[tuple[int, int, int], ...] | None = None
        cheap_last = last and w.last_snapshot_ns <= CHEAP_SNAPSHOT_NS
        if cheap_last or self._affordable(w, now, STEP_END):
            sites, total = self._snapshot(w, STEP_END)
            w.own = max(current - total, 0)
            changes = self._site_changes(w, w.ends[-1].sites, sites)
            w.ends.append(PythonHeapPoint(now, sites))
            self._offer_peak(w, now, sites, total)
        else:  # over the budget: the totals only, without the sites
            total = max(current - w.own, 0)
            w.skipped_snapshots += 1
        step_peak = max(step_peak, total)
        w.timeline.append((now, total))
        w.rows.append(
            StepMemoryRow(
                w.step,
                w.step_start_ns,
                now,
                python_current=total,
                python_peak=step_peak,
                rss=rss,
                site_changes=changes,
                site_changes_since_ns=w.ends[-2].t_ns if changes is not None else None,
                cuda_allocator=_cuda_allocator_stats(),
            )
        )
        if step_peak > w.peak_bytes:
            w.peak_bytes, w.peak_step = step_peak, w.step
        return rss

    def _end_sampled_step(self, w: _Window, heap: SampledHeap, now: int, rss: int | None) -> None:
        """A step of the hook: exact counters, the sampled sites at its end and at its peak."""
        heap.pause(True)
        try:
            counts, sites = heap.end_step(want_peak_sites=True)
            changes = self._site_changes(w, w.ends[-1].sites, sites)
            w.ends.append(PythonHeapPoint(now, sites, counts["current"]))
            _, high = heap.poll()
            w.timeline.append((now, max(high, counts["peak"])))
            w.timeline.append((now, counts["current"]))
            w.rows.append(
                StepMemoryRow(
                    w.step,
                    w.step_start_ns,
                    now,
                    python_current=counts["current"],
                    python_peak=counts["peak"],
                    rss=rss,
                    python_allocated=counts["allocated"],
                    python_freed=counts["freed"],
                    site_changes=changes,
                    site_changes_since_ns=w.ends[-2].t_ns,
                    cuda_allocator=_cuda_allocator_stats(),
                )
            )
            if counts["peak"] > w.peak_bytes and heap.peak_sites is not None:
                w.peak_bytes, w.peak_step = counts["peak"], w.step
                w.peak = PythonHeapPoint(heap.peak_t_ns or now, heap.peak_sites, counts["peak"])
                w.peak_total = sum(b for b, _ in heap.peak_sites.values())
        finally:
            heap.pause(False)

    @staticmethod
    def _site_changes(w: _Window, before: Sites, after: Sites) -> tuple[tuple[int, int, int], ...]:
        """The sites whose held bytes changed most since the last snapshot: ``[site, bytes,
        blocks]`` rows (allocations up, frees down), sites interned in ``w.site_ids``."""
        moved = []
        for site in before.keys() | after.keys():
            size0, count0 = before.get(site, (0, 0))
            size1, count1 = after.get(site, (0, 0))
            if size1 != size0:
                moved.append((site, size1 - size0, count1 - count0))
        moved.sort(key=lambda m: -abs(m[1]))
        return tuple(
            (w.site_ids.setdefault(site, len(w.site_ids)), size, count)
            for site, size, count in moved[:SITE_CHANGES]
        )

    @staticmethod
    def _offer_peak(w: _Window, now: int, sites: Sites, total: int) -> None:
        if w.peak is None or total > w.peak_total:
            w.peak, w.peak_total = PythonHeapPoint(now, sites), total

    def _watch(self) -> None:
        """The watcher thread: a failure there is counted and ends the watching, nothing more."""
        w = self._window
        try:
            if w is not None and w.heap is not None:
                w.heap.pause(True)  # the watcher's own allocations are not the program's
                self._poll_hook(w.heap)
                return
            self._poll()
        except Exception as exc:
            w = self._window
            if w is not None:
                w.watch_error = f"{type(exc).__name__}: {exc}"
            _failures.report(
                "memory_watcher_error",
                "the memory watcher thread",
                exc,
                strict=False,  # nothing could catch it in this thread
                then="the peak table and the timeline use step ends only",
            )

    def _poll_hook(self, heap: SampledHeap) -> None:
        """Draw the timeline from the hook's exact counters: the most held in each interval."""
        while not self._stop_watch.wait(self.poll_interval_s):
            w = self._window
            if w is None:
                return
            with self._lock:
                _, high = heap.poll()
                w.timeline.append((clock.now_ns(), high))
                if len(w.timeline) > 2 * MAX_TIMELINE_POINTS:
                    w.timeline = thin_points(w.timeline, MAX_TIMELINE_POINTS)

    def _poll(self) -> None:
        """Poll the traced total; snapshot each new high of the window (the peak table)."""
        while not self._stop_watch.wait(self.poll_interval_s):
            w = self._window
            if w is None:
                return
            with self._lock:
                current, peak = tracemalloc.get_traced_memory()
                now = clock.now_ns()
                held = current - w.own
                w.step_peak = max(w.step_peak, peak - w.own)
                w.timeline.append((now, held))
                if len(w.timeline) > 2 * MAX_TIMELINE_POINTS:
                    w.timeline = thin_points(w.timeline, MAX_TIMELINE_POINTS)
                settled = abs(held - w.last_held) <= held // 100  # the rise has stopped
                w.last_held = held
                if held > w.peak_total * 1.05 + 65536 and self._new_high_wanted(w, now, settled):
                    w.high_step = w.step
                    sites, total = self._snapshot(w, NEW_HIGH)
                    self._offer_peak(w, now, sites, total)
                    w.own = max(tracemalloc.get_traced_memory()[0] - total, 0)
                    if w.started_tracing:  # the snapshot's own objects are not the program's
                        tracemalloc.reset_peak()

    def _new_high_wanted(self, w: _Window, now: int, settled: bool) -> bool:
        """Within the budget, every new high; beyond it, one settled high per step while
        within three times the budget (a big heap's snapshots are dear)."""
        if self._affordable(w, now, NEW_HIGH):
            return True
        cap = OVER_BUDGET_CAP * SNAPSHOT_SHARE * (now - w.window_start_ns)
        spent = w.snapshot_ns[NEW_HIGH] + self._next_snapshot_ns(w)
        return settled and w.high_step != w.step and spent <= cap

    def stop(self, ctx: WindowContext) -> None:
        """End the last step, stop the watcher, and tracemalloc if stepscope started it."""
        w = self._window
        if w is None:
            return
        self._stop_watch.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        self._unhook_optimizers()
        try:
            self._end_step(w, clock.now_ns(), last=True)
        finally:
            w.rss_reader.close()
            if w.heap is not None:
                w.heap.stop()
            if w.started_tracing and tracemalloc.is_tracing():
                tracemalloc.stop()

    # -- torch's optimizers --------------------------------------------------------------------
    # A listener of the one process-wide hook, not a hook of its own: the window starts and
    # stops inside torch's hook loop when steps come from the optimizer.
    def _hook_optimizers(self) -> None:
        if "torch.optim.optimizer" in sys.modules:
            optimizer_hook.add_listener(self._after_optimizer_step, strict=self.strict)
            self._optimizer_hook = True

    def _after_optimizer_step(self, optimizer: Any) -> None:
        self.optimizers[id(optimizer)] = optimizer

    def _unhook_optimizers(self) -> None:
        if self._optimizer_hook:
            optimizer_hook.remove_listener(self._after_optimizer_step)
        self._optimizer_hook = False

    # -- results -------------------------------------------------------------------------------
    def collect(self, builder: TraceBuilder, ctx: WindowContext) -> None:
        """Per-step rows, the peak table, the leak hint and counter tracks into the trace."""
        w, self._window = self._window, None
        if w is None:
            return
        self.torch_result = getattr(self.torch_collector, "last_result", None)
        meta: dict[str, Any] = {
            "tracemalloc": _tracemalloc_state(w),
            "steps": [row.to_json() for row in w.rows],
            "sites": [
                {"function": function_at(file, line), "file": short_path(file), "line": line}
                for (file, line) in w.site_ids
            ],
            "notes": [],
        }
        if w.peak is not None:
            meta["peak"] = {
                "step": w.peak_step,
                "bytes": w.peak_bytes,
                "snapshot_bytes": w.peak_total,
                "t_ns": w.peak.t_ns,
                "table": site_rows(w.peak.sites, PEAK_TABLE_ROWS),
            }
        if w.heap is not None:
            meta["heap"] = self._hook_meta(w.heap, meta["notes"])
        elif self.exact is False and w.hook_fallback:
            meta["notes"].append(
                f"the Python heap was traced with tracemalloc ({w.hook_fallback}), which costs "
                "several times more than the allocation hook"
            )
        if w.tracing_lost_step is not None:
            meta["notes"].append(
                f"the program stopped tracemalloc at step {w.tracing_lost_step}: no Python heap "
                "figures from then on"
            )
        if w.watch_error:
            meta["notes"].append(f"the memory watcher failed ({w.watch_error}): step ends only")
        if w.skipped_snapshots:
            meta["notes"].append(
                f"{w.skipped_snapshots} step-end snapshots of the Python heap were skipped to "
                f"keep them under {SNAPSHOT_SHARE:.0%} of the window's time (totals are kept)"
            )
        meta["growth"] = self._site_growth(w)
        meta[BY_MODULE_KEY] = module_points([*w.ends, *([w.peak] if w.peak is not None else [])])
        self._tensor_tracks(builder, ctx)
        for t, held in thin_points(w.timeline, MAX_TIMELINE_POINTS):
            builder.counter(PYTHON_HEAP_TRACK, ctx.pid, t, {"bytes": held})
        for t, rss in thin_points(w.rss, MAX_TIMELINE_POINTS):
            builder.counter(RSS_TRACK, ctx.pid, t, {"bytes": rss})
        builder.metadata[MEMORY_KEY] = meta

    @staticmethod
    def _hook_meta(heap: SampledHeap, notes: list[str]) -> dict[str, Any]:
        """The hook's mode, own memory and losses; notes for what the report must say."""
        stats = heap.stats
        notes.append(sampling_error_note(heap.mean_bytes))
        if stats.get("dropped"):
            notes.append(
                f"{stats['dropped']} allocation samples were dropped (more than the buffer holds "
                "between two step ends): sites are less certain"
            )
        if stats.get("untracked"):
            notes.append(
                f"{stats['untracked']} allocations could not be tracked (no memory for the "
                "hook's table): their frees are not counted"
            )
        if not heap.restored:
            notes.append(
                "another allocator hook was set after stepscope's: stepscope's stays in its "
                "chain as a pass-through"
            )
        if stats.get("lost_frees"):
            notes.append(
                f"{stats['lost_frees']} frees of sampled blocks were lost (no memory for the "
                "buffer): some sites may be shown alive after they were freed"
            )
        if heap.numpy.startswith("not counted"):
            notes.append(f"numpy arrays: {heap.numpy}")
        return {"mode": "sampled", "mean_bytes": heap.mean_bytes, "numpy": heap.numpy, **stats}

    @staticmethod
    def _site_growth(w: _Window) -> list[dict[str, Any]]:
        """The sites whose held bytes grew over the window (from past the warm-up to the last
        step end), largest first: the analysis names them when the heap rose steadily."""
        if len(w.ends) < 2:
            return []
        first = w.ends[2] if len(w.ends) >= 6 else w.ends[1]  # past the warm-up rise
        last = w.ends[-1].sites
        growth = {
            site: size - first.sites.get(site, (0, 0))[0]
            for site, (size, _) in last.items()
            if size - first.sites.get(site, (0, 0))[0] > 0
        }
        floor = max(1024, sum(growth.values()) // 100)  # smaller growth is noise
        grown = sorted(((k, v) for k, v in growth.items() if v >= floor), key=lambda i: -i[1])[:10]
        return [
            {
                "function": function_at(file, line),
                "file": short_path(file),
                "line": line,
                "growth_bytes": size,
            }
            for (file, line), size in grown
        ]

    @staticmethod
    def _tensor_tracks(builder: TraceBuilder, ctx: WindowContext) -> None:
        """torch's allocator total per device as counter tracks (``Memory <device>``)."""
        by_device: dict[str, list[tuple[int, float]]] = {}
        for e in tensor_events(builder.instants_named(MEMORY_INSTANT)):
            by_device.setdefault(e.device, []).append((e.ts_ns, e.total_allocated))
        for device, points in by_device.items():
            builder.counter_series(f"Memory {device}", ctx.pid, "Total Allocated", points)

    def window_built(self, trace: Trace) -> None:
        """Every collector has read the window: the watcher's thread id is free again."""
        hide_thread(self._watcher_id, hidden=False)
        self._watcher_id = None

    def after_fork_in_child(self) -> None:
        """A forked child keeps nothing of the parent's window (its watcher did not survive)."""
        w, self._window = self._window, None
        self._watcher = None
        self._unhook_optimizers()
        if w is not None and w.started_tracing and tracemalloc.is_tracing():
            tracemalloc.stop()
        if w is not None and w.heap is not None:
            w.heap.stop()

    def close(self) -> None:
        """Stop anything a window left running."""
        if self._window is not None:
            self.stop(WindowContext(window=-1))
            self._window = None


def _tracemalloc_state(w: _Window) -> str:
    if w.heap is not None:
        return "not used (the allocation hook counted the heap)"
    return "started for the window" if w.started_tracing else "already running: left as it was"


_CUDA_STATS = (
    (("allocated_bytes", "all", "current"), "allocated"),
    (("allocated_bytes", "all", "peak"), "allocated_peak"),
    (("reserved_bytes", "all", "current"), "reserved"),
    (("num_alloc_retries",), "alloc_retries"),
    (("num_ooms",), "ooms"),
)
"""Where each counter sits in ``memory_stats_as_nested_dict()``, and its name in a step row."""


def _cuda_allocator_stats() -> dict[str, int]:
    """torch's CUDA caching allocator counters, when the program has initialized CUDA (the
    nested form: ``memory_stats()`` flattens and sorts every counter, several times the cost)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return {}
    stats: Mapping[str, Any] = cuda.memory_stats_as_nested_dict()
    found = {}
    for path, short in _CUDA_STATS:
        value: Any = stats
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, int):
            found[short] = value
    return found
