"""The torch collector: torch's own profiler (Kineto) run inside stepscope's windows.

Kineto is prepared at WARMUP and started at RECORD, like torch.profiler does; the window's stop
ends the session on the loop's thread (torch's ``_disable_profiler``, which torch.profiler pays
too) and hands it to ``collect``, which may run on the profile's writer thread: there Kineto's
result is saved (by Kineto's C++ writer: torch offers no other whole form of it than a file)
and read back as a ``Trace``, which is merged into the window's trace on stepscope's clock
(off the loop, Kineto's writer runs in a forked child: ``kineto_save.py``).
When the profile saves off the loop (``torch_events=False``) and nothing needs torch's own event
list (``profile_memory``'s timeline, FLOPs, module frames), the session is ``trace_only``: torch
skips building that list at the stop, about a third of the stop's time.

Kineto stamps events with the wall clock (``CLOCK_REALTIME``); the offset between that and
stepscope's clock is measured when recording starts, so torch ops land inside the stepscope spans
that enclosed them.

While torch records with a device activity, or torch's own profiler or execution trace observer
records, ``stepscope.record_function`` also opens torch's ``record_function`` (the bridge), so
annotations appear on the GPU timeline and in the execution trace; their CPU-side copies in
torch's result are dropped in the merge, and their ids go onto stepscope's own spans.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stepscope import clock, steps
from stepscope.activity import ProfilerActivity
from stepscope.atomic import scratch
from stepscope.collectors import import_watch
from stepscope.collectors.annotations import OPEN_FLAG, default_backend
from stepscope.collectors.base import Collector, WindowContext
from stepscope.collectors.compiled import torch_args
from stepscope.collectors.kineto_save import save_kineto
from stepscope.collectors.open_blocks import (
    ENDS_WITH_ITS_STEP,
    ExitWatch,
    LeftOpen,
    any_left_open,
    blocks_left_open,
)
from stepscope.extras import torch_available
from stepscope.failures import failure_log
from stepscope.trace.chrome_reader import read_chrome_trace
from stepscope.trace.model import Trace, TraceBuilder
from stepscope.trace.nesting import DEVICE_CATEGORIES

__all__ = [
    "TorchCollector",
    "advance_kineto_step",
    "bridged_names",
    "install_torch_profiler_hooks",
    "take_bridge_errors",
    "want_bridge",
]

DEVICE_NAMES = {
    ProfilerActivity.CUDA: "cuda",
    ProfilerActivity.XPU: "xpu",
    ProfilerActivity.MTIA: "mtia",
    ProfilerActivity.HPU: "hpu",
    ProfilerActivity.PrivateUse1: "privateuseone",
}
# Metadata torch writes that stepscope writes itself (or must not take from torch).
TORCH_OWN_KEYS = frozenset({"trace_id", "traceName"})


PYTHON_CATEGORY = "python_function"
MODULE_PREFIX = "nn.Module: "
MODULE_ID_BASE = 1 << 40
"""Added to the ``Python id`` of torch's module frames (stepscope's tracer counts from 1)."""

_failures = failure_log("collectors")
OPEN_BLOCKS_KEY = "stepscope_torch_open_blocks"
"""Window metadata: why torch's profiler started late in this window, or not at all."""

FLOPS_KEY = "stepscope_flops"
DEVICE_SIDE = DEVICE_CATEGORIES | {"Trace"}
"""Spans a window's stop does not end: device work (it runs on after the host's stop) and
Kineto's own session span."""
"""Trace metadata: ``{External id: flops}`` of torch's ops (Kineto's JSON leaves FLOPs out)."""


def _end_spans_at(builder: TraceBuilder, first: int, end_ns: int) -> int:
    """End the host spans appended from row ``first`` on that outlive ``end_ns`` at ``end_ns``,
    flagged ``OPEN_FLAG``; returns how many."""
    starts, durs = builder.column("spans", "start_ns"), builder.column("spans", "dur_ns")
    cats = builder.column("spans", "cat")
    device_side = {builder.intern(name) for name in DEVICE_SIDE}
    cut = 0
    for row in range(first, len(starts)):
        if starts[row] < end_ns < starts[row] + durs[row] and cats[row] not in device_side:
            durs[row] = end_ns - starts[row]
            builder.set_row_args(
                "spans", row, {**(builder.row_args("spans", row) or {}), OPEN_FLAG: True}
            )
            cut += 1
    return cut


def _flops_by_id(results: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for event in results.events():
        flops = event.flops()
        if flops:
            out[str(event.correlation_id())] = int(flops)
    return out


ANSWER_WAIT_S = 120.0
"""How long the next session's start waits for the last window's save to say which torch
blocks it left open (past it, torch is held back for that window, and the trace says so)."""


@dataclass
class _Stopped:
    """A window's stopped session, handed from ``stop`` to ``collect``."""

    prof: Any
    offset_ns: int
    bridged: frozenset[str]
    left_open: LeftOpen


def _wall_offset_ns() -> int:
    """CLOCK_REALTIME minus stepscope's Unix time, from the tightest of a few paired readings."""
    readings = []
    for _ in range(5):
        before = clock.now_ns()
        wall = time.time_ns()
        after = clock.now_ns()
        readings.append((after - before, wall - clock.to_unix_ns((before + after) // 2)))
    return min(readings)[1]


class TorchCollector(Collector):
    """Records torch operators (and device kernels) through torch's profiler.

    Whether torch is in use is decided when a window is prepared and again whenever the program
    imports torch: a window that begins before ``import torch`` starts torch's profiler right
    after that import, so ``stepscope run --step-on none script.py`` records the script's ops.
    """

    name = "torch"
    collects_off_loop = True

    def __init__(
        self,
        activities: Iterable[ProfilerActivity] = (ProfilerActivity.CPU,),
        *,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_flops: bool = False,
        with_modules: bool = False,
        module_frames: bool = False,
        experimental_config: Any = None,
        bridge_annotations: bool | None = None,
        activity_filters: dict[str, list[str]] | None = None,
        post_processing_timeout_s: float | None = None,
        torch_events: bool = True,
    ) -> None:
        """``module_frames``: torch's Python tracer runs too, for its ``nn.Module: X_n`` frames
        (TensorBoard's Module view); its other frames are dropped (stepscope's tracer has them).
        ``torch_events=False``: torch's own event list (``last_result.events()``) is not built
        at the stop unless FLOPs, the memory timeline or module frames need it (``trace_only``).
        """
        self.torch_events = torch_events
        self._autograd_profiler: Any = None
        acts = set(activities)
        devices = [DEVICE_NAMES[a] for a in acts if a in DEVICE_NAMES]
        if len(devices) > 1:
            raise ValueError(f"record one device type at a time, got {sorted(devices)}")
        self.use_cpu = ProfilerActivity.CPU in acts
        self.use_device = devices[0] if devices else None
        self.options = {
            "record_shapes": record_shapes,
            "profile_memory": profile_memory,
            "with_flops": with_flops,
            "with_modules": with_modules,
            "experimental_config": experimental_config,
        }
        self.module_frames = module_frames
        self.activity_filters = dict(activity_filters or {})
        """``{activity name: [event type names]}``: torch records only those types."""
        self.post_processing_timeout_s = post_processing_timeout_s
        self.bridge_annotations = (
            self.use_device is not None if bridge_annotations is None else bridge_annotations
        )
        self._prof: Any = None
        self._offset_ns = 0
        self._ctx: WindowContext | None = None
        self._phase = "idle"  # idle -> prepared -> recording -> idle (stop)
        self._waiting = False  # for the program to import torch
        self._started = False
        self.last_result: Any = None
        """torch's ``autograd.profiler.profile`` of the last window (for torch's own tables)."""
        self._open: Counter[str] = Counter()
        """Blocks the last session left open on the thread that stopped it (open_blocks.py):
        no session starts until they have exited."""
        self._open_since_step: int | None = None
        self._watch: ExitWatch | None = None
        self._deferred = False
        """This window's session waits for ``_open`` to exit."""
        self._held_back = False
        """This window's session was held back (waiting, or not started at all)."""
        self._left_open: LeftOpen | None = None
        """What the last stopped session left open, until the loop has taken the answer."""

    def prepare(self, ctx: WindowContext) -> None:
        """Create and prepare torch's profiler (Kineto warms up here), once torch is imported."""
        self._ctx, self._phase = ctx, "prepared"
        self._catch_up()

    def start(self, ctx: WindowContext) -> None:
        """Start torch's profiler and the record_function bridge (once torch is imported)."""
        self._ctx, self._phase = ctx, "recording"
        self._catch_up()

    def _catch_up(self) -> None:
        """Bring torch's profiler to the window's phase, or wait for the program's torch import."""
        if not torch_available():
            if not self._waiting:
                self._waiting = True
                import_watch.when_imported("torch", self._torch_imported)
            return
        if not self._take_left_open(wait=self._phase == "recording" and not self._started):
            if not self._held_back:
                self._held_back = True
                self._note_open_blocks(
                    "not started in this window",
                    f"the last window's save had not said within {ANSWER_WAIT_S:.0f} s which "
                    "torch record_function blocks it left open",
                )
            return
        if self._blocks_still_open() and not self._can_wait():
            if self._phase == "recording" and not self._held_back:
                self._held_back = True  # not prepared either: torch warns at a later prepare
                self._note_open_blocks("not started in this window")
            return
        if self._prof is None:
            self._prepare_torch()
        if self._phase == "recording" and not self._started and not self._deferred:
            if self._blocks_still_open():  # started when they have exited
                self._held_back = self._deferred = True
            else:
                self._start_torch()

    def _torch_imported(self) -> None:
        self._waiting = False
        if self._phase == "idle" or self._ctx is None:
            return
        self._ctx.metadata["stepscope_torch_started_late"] = (
            "the program imported torch during this window; torch ops are recorded from then on"
        )
        self._catch_up()

    def _prepare_torch(self) -> None:
        if self._autograd_profiler is None:
            import torch.autograd.profiler as autograd_profiler

            self._autograd_profiler = autograd_profiler
        self._started = False
        # passed only when asked for: torch before 2.13 has no activity_filters (on 2.11 the
        # keyword alone turned the collector off)
        newer = {
            "post_processing_timeout_s": self.post_processing_timeout_s,
            "activity_filters": self._torch_filters(),
        }
        options = {**self.options, "experimental_config": self._experimental_config()}
        self._prof = self._autograd_profiler.profile(
            use_cpu=self.use_cpu,
            use_device=self.use_device,
            use_kineto=True,
            # Python frames come from stepscope's own tracer; torch's only for module frames
            with_stack=self.module_frames,
            acc_events=False,
            **{name: value for name, value in newer.items() if value is not None},
            **options,
        )
        self._prof._prepare_trace()

    def _experimental_config(self) -> Any:
        """The program's experimental config, else ``trace_only`` where nothing needs torch's
        own event list (it is built at the stop, on the loop: about a third of the stop)."""
        given = self.options["experimental_config"]
        needs_events = self.options["profile_memory"] or self.options["with_flops"]
        if given is not None or needs_events or self.module_frames or self.torch_events:
            return given
        try:
            from torch._C._profiler import _ExperimentalConfig

            return _ExperimentalConfig(trace_only=True)
        except (ImportError, TypeError):  # a torch without trace_only
            return None

    def _torch_filters(self) -> dict[Any, set[str]] | None:
        if not self.activity_filters:
            return None
        from torch.profiler import ProfilerActivity as TorchActivity

        return {getattr(TorchActivity, k): set(v) for k, v in self.activity_filters.items()}

    # -- blocks left open by the last session (open_blocks.py) ------------------------------
    def _take_left_open(self, wait: bool) -> bool:
        """Take the last session's answer (on the loop's thread, which the watch watches);
        False if it was needed now and did not come."""
        left_open = self._left_open
        if left_open is None:
            return True
        if not left_open.wait(ANSWER_WAIT_S if wait else 0):
            return not wait
        self._left_open = None
        self._end_watch()
        self._open = Counter(left_open.names)
        if left_open.names:
            self._open_since_step = left_open.step
            self._watch_open_blocks()
        return True

    def _blocks_still_open(self) -> bool:
        """Whether blocks the last session left open may still be open."""
        if not self._open:
            return False
        step = steps.current_step()
        if self._open_since_step is not None and step is not None and step > self._open_since_step:
            for name in [n for n in self._open if n.startswith(ENDS_WITH_ITS_STEP)]:
                del self._open[name]  # a later step: torch's optimizer blocks have ended
        if not self._open:
            self._end_watch()
            return False
        return True

    def _watch_open_blocks(self) -> None:
        """Watch the blocks the stopped session left open exit (on this thread)."""
        import torch.autograd.profiler as autograd_profiler

        exit_code = autograd_profiler.record_function.__exit__.__code__
        watch = ExitWatch(self._open, exit_code, self._blocks_closed)
        if watch.install():
            self._watch = watch

    def _end_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()

    def _can_wait(self) -> bool:
        """Whether a session can start once the open blocks have exited: the watch will see
        them exit, or they are torch's optimizer blocks (the next step ends them)."""
        if self._watch is not None and self._watch.live:
            return True
        return all(n.startswith(ENDS_WITH_ITS_STEP) for n in self._open)

    def _blocks_closed(self) -> None:
        """The watch saw the last open block exit (called from its profile function)."""
        self._watch = None
        if not self._deferred:
            return
        self._deferred = False
        try:
            if self._phase == "recording" and self._prof is not None and not self._started:
                self._start_torch()
        except Exception as exc:  # a profile function must not raise into the program
            _failures.report(
                "collector_error",
                "torch's profiler started after the blocks left open had exited",
                exc,
                strict=False,
                then="this window has no torch events",
            )

    def _note_open_blocks(self, what: str, why: str | None = None) -> None:
        names = ", ".join(sorted(self._open))
        why = why or (
            f"torch record_function blocks the last window left open ({names}) had not ended "
            "where stepscope could see them"
        )
        note = (
            f"torch's profiler {what}: {why}, and torch writes a block's "
            "end into the session that records then (freed memory if it is not the one that "
            "began it); end the steps outside such blocks, or leave a step between windows"
        )
        if self._ctx is not None:
            self._ctx.metadata[OPEN_BLOCKS_KEY] = note
            self._ctx.summary.append(note)

    def on_step(self, ctx: WindowContext, step: int) -> None:
        """A step ended in a window whose session waits: start it if the blocks it waits for
        have ended by now (torch's optimizer blocks have), else give up for this window."""
        if not self._deferred:
            return
        if self._blocks_still_open():
            self._deferred = False
            self._end_watch()
            self._note_open_blocks("not started in this window")
            return
        self._deferred = False
        ctx.metadata[OPEN_BLOCKS_KEY] = (
            f"torch's profiler started at step {step}, after torch blocks the last window left "
            "open had ended"
        )
        self._start_torch()

    def _start_torch(self) -> None:
        global _own_session
        _own_session = True
        try:
            self._prof._start_trace()
        finally:
            _own_session = False
        self._started = True
        self._offset_ns = _wall_offset_ns()
        bridged_names.clear()
        if self.bridge_annotations:
            want_bridge(BRIDGE_FOR_COLLECTOR, True)

    def stop(self, ctx: WindowContext) -> None:
        """Stop torch's profiler (synchronizing the device, as torch does)."""
        self._stop_waiting()
        self._phase = "idle"
        self._deferred = False
        held_back, self._held_back = self._held_back, False
        if held_back and not self._started:
            self._prof = None  # never started (stopping it would only make torch warn)
            return
        if self._prof is None:
            self._note_torch_never_came(ctx)
            return
        if self.bridge_annotations:
            want_bridge(BRIDGE_FOR_COLLECTOR, False)
        errors = take_bridge_errors()
        if errors:
            ctx.metadata["stepscope_torch_bridge_errors"] = errors
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        # (the answer of the window before was taken when this window's session started)
        left_open = self._left_open = LeftOpen(threading.get_native_id(), steps.current_step())
        ctx.held[id(self)] = _Stopped(prof, self._offset_ns, frozenset(bridged_names), left_open)

    def collect(self, builder: TraceBuilder, ctx: WindowContext) -> None:
        """Merge torch's events into the window's trace on stepscope's clock."""
        stopped = ctx.held.pop(id(self), None)
        if stopped is None:
            return
        names: list[str] = []
        try:
            prof = stopped.prof
            if prof.kineto_results is None:
                return
            self.last_result = prof
            fd, tmp = tempfile.mkstemp(prefix="stepscope-kineto-", suffix=".json")
            os.close(fd)
            try:
                with scratch(tmp):
                    # off the loop, unless the loop is waiting for this save (its last
                    # window: the stop): saving here is then faster than a forked child
                    off_loop = threading.get_native_id() != stopped.left_open.tid
                    off_loop = off_loop and not ctx.loop_waits()
                    save_kineto(prof.kineto_results, tmp, self.use_device, off_loop)
                    unfinished = any_left_open(tmp)
                    if not unfinished:  # the usual answer, given before the file is read
                        stopped.left_open.found([])
                    trace = read_chrome_trace(tmp, drop_kineto_bookkeeping=True)
                    if unfinished:
                        names = blocks_left_open(trace, stopped.left_open.tid)
            finally:
                os.unlink(tmp)
        finally:
            stopped.left_open.found(names)
            if threading.get_native_id() == stopped.left_open.tid:
                self._take_left_open(wait=False)  # on the loop: watch the blocks from now
        if names:
            ctx.metadata[OPEN_BLOCKS_KEY + "_at_end"] = sorted(names)
        self._merge(builder, ctx, stopped, trace)

    def _merge(
        self, builder: TraceBuilder, ctx: WindowContext, stopped: _Stopped, trace: Trace
    ) -> None:
        """Add torch's events, less stepscope's own annotations' copies, on stepscope's clock."""
        offset = stopped.offset_ns
        skip_spans = self._duplicate_annotations(trace, stopped.bridged)
        if skip_spans:
            self._take_torch_ids(builder, trace, skip_spans, offset)
        if self.module_frames:
            skip_spans |= self._add_module_frames(builder, trace, offset)
        skip_meta = self._own_names(trace, ctx.pid)
        first = builder.span_rows
        builder.add_trace(trace, time_offset_ns=-offset, skip_spans=skip_spans, skip_meta=skip_meta)
        if ctx.stopping_ns:
            # a window ended from inside a span of the program's (the optimizer's post-hook
            # runs inside torch's ``Optimizer.step#...``): torch ends that span after our
            # stop and collection; it ends where the program's own work did
            _end_spans_at(builder, first, ctx.stopping_ns)
        for key in TORCH_OWN_KEYS:
            builder.metadata.pop(key, None)
        builder.metadata["stepscope_torch_events"] = trace.event_count()
        if self.options["with_flops"]:
            builder.metadata[FLOPS_KEY] = _flops_by_id(stopped.prof.kineto_results)

    @staticmethod
    def _duplicate_annotations(trace: Trace, bridged: frozenset[str]) -> set[int]:
        """CPU-side copies of bridged stepscope annotations (stepscope's own spans stay)."""
        if not bridged:
            return set()
        names, cats = trace.spans["name"], trace.spans["cat"]
        strings = trace.strings
        return {
            i
            for i in range(len(trace.spans))
            if strings[cats[i]] == "user_annotation" and strings[names[i]] in bridged
        }

    def _add_module_frames(self, builder: TraceBuilder, trace: Trace, offset: int) -> set[int]:
        """Add torch's ``nn.Module`` frames, each the child of the module that called it (the
        tree TensorBoard's Module view walks); returns every torch Python frame to leave out.

        Their ``Python id`` is offset so that it cannot collide with stepscope's tracer's ids.
        """
        spans, strings = trace.spans, trace.strings
        frames = [i for i in range(len(spans)) if strings[spans["cat"][i]] == PYTHON_CATEGORY]
        parent: dict[int, int | None] = {}
        modules: list[tuple[int, Any]] = []
        for i in frames:
            args = trace.args_at(spans["args"][i]) or {}
            py_id = args.get("Python id")
            if not isinstance(py_id, int):
                continue
            parent[py_id] = args.get("Python parent id")
            if strings[spans["name"][i]].startswith(MODULE_PREFIX):
                modules.append((i, args))
        module_ids = {args["Python id"] for _, args in modules}
        shift = trace.base_time_ns - builder.base_time_ns - offset
        for i, args in modules:
            above = parent.get(args["Python id"])
            while above is not None and above not in module_ids:
                above = parent.get(above)
            builder.span(
                strings[spans["name"][i]],
                PYTHON_CATEGORY,
                trace.label(spans["pid"][i]),
                trace.label(spans["tid"][i]),
                spans["start_ns"][i] + shift,
                spans["dur_ns"][i],
                {
                    "Python id": MODULE_ID_BASE + args["Python id"],
                    "Python parent id": None if above is None else MODULE_ID_BASE + above,
                    "Python module id": args.get("Python module id"),
                },
            )
        return set(frames)

    @staticmethod
    def _take_torch_ids(builder: TraceBuilder, trace: Trace, copies: set[int], offset: int) -> None:
        """Give each stepscope annotation the args of torch's copy of it (``Record function id``,
        ``External id``, shapes): the ids the execution trace and torch's events know it by."""
        shift = trace.base_time_ns - builder.base_time_ns - offset
        annotation = builder.intern("user_annotation")
        own: dict[tuple[int, int], list[int]] = {}
        cats, names, tids = (builder.column("spans", c) for c in ("cat", "name", "tid"))
        starts, durs = builder.column("spans", "start_ns"), builder.column("spans", "dur_ns")
        for row in range(builder.span_rows):
            if cats[row] == annotation:
                own.setdefault((names[row], tids[row]), []).append(row)
        spans, strings = trace.spans, trace.strings
        for i in sorted(copies, key=lambda k: spans["start_ns"][k]):
            args = trace.args_at(spans["args"][i])
            key = (
                builder.intern(strings[spans["name"][i]]),
                builder.encode_label(trace.label(spans["tid"][i])),
            )
            rows = own.get(key)
            if not args or not rows:
                continue
            start = spans["start_ns"][i] + shift
            end = start + spans["dur_ns"][i]
            row = min(rows, key=lambda r: abs(starts[r] - start) + abs(starts[r] + durs[r] - end))
            rows.remove(row)
            builder.set_row_args("spans", row, {**args, **(builder.row_args("spans", row) or {})})

    @staticmethod
    def _own_names(trace: Trace, pid: int) -> set[int]:
        """torch's process_name for our pid: stepscope names its own process."""
        meta = trace.meta
        strings = trace.strings
        return {
            i
            for i in range(len(meta))
            if strings[meta["name"][i]] == "process_name" and meta["pid"][i] == pid
        }

    def _stop_waiting(self) -> None:
        if self._waiting:
            self._waiting = False
            import_watch.cancel("torch", self._torch_imported)

    def _note_torch_never_came(self, ctx: WindowContext) -> None:
        # profile_memory also measures the Python heap and the RSS without torch: only what
        # records nothing without torch, and the user asked for, is named
        asked = [flag for flag, value in self.options.items() if value and flag != "profile_memory"]
        if self.use_device is not None:
            asked.append(f"activity {self.use_device.upper()}")
        if asked:
            ctx.summary.append(
                f"{', '.join(asked)} recorded nothing: the program did not import torch "
                "during this window"
            )
        ctx.metadata["stepscope_torch"] = "not imported during this window"

    def close(self) -> None:
        """Stop torch's profiler if a window was left open."""
        self._stop_waiting()
        self._end_watch()
        self._left_open = None
        self._deferred = False
        self._phase = "idle"
        if self._held_back and self._prof is not None and not self._started:
            self._prof = None  # never started (stopping it would only make torch warn)
        self._held_back = False
        if self._prof is not None:
            want_bridge(BRIDGE_FOR_COLLECTOR, False)
            try:
                self._prof.__exit__(None, None, None)
            finally:
                self._prof = None


# -- the record_function bridge: stepscope's annotations opened in torch too --------------------
BRIDGE_FOR_COLLECTOR = "a stepscope window records torch with a device"
BRIDGE_FOR_TORCH_PROFILER = "torch's own profiler records"
BRIDGE_FOR_EXECUTION_TRACE = "torch's execution trace observer records"
_bridge_reasons: set[str] = set()
_bridge_errors = 0
bridged_names: set[str] = set()
"""Names of the blocks opened in torch too (their copies in torch's trace are duplicates)."""


def _torch_bridge_enter(name: str, args: Any) -> Any:
    import torch.autograd.profiler as autograd_profiler

    bridged_names.add(name)
    handle: Any = autograd_profiler.record_function(name, torch_args(args))
    handle.__enter__()
    return handle


def _torch_bridge_exit(handle: Any) -> None:
    handle.__exit__(None, None, None)


def want_bridge(reason: str, on: bool) -> None:
    """Turn one reason to bridge on or off; the bridge is set while any reason holds."""
    global _bridge_errors
    if on:
        _bridge_reasons.add(reason)
    else:
        _bridge_reasons.discard(reason)
    bridge = (_torch_bridge_enter, _torch_bridge_exit) if _bridge_reasons else None
    _bridge_errors += default_backend.set_bridge(bridge)


def take_bridge_errors() -> int:
    """Bridge failures since the last call (each switched the bridge off until set again)."""
    global _bridge_errors
    errors = default_backend.set_bridge(
        (_torch_bridge_enter, _torch_bridge_exit) if _bridge_reasons else None
    )
    errors, _bridge_errors = errors + _bridge_errors, 0
    return errors


# -- torch's own profiler (torch.profiler.profile, dynolog on-demand tracing) -------------------
_own_session = False  # True while a TorchCollector starts torch's profiler
STEP_TRACKER_NAME = "stepscope.profile"


def _on_torch_profiler_start() -> None:
    """torch's profiler started outside stepscope: stepscope's annotations join its trace."""
    if not _own_session:
        want_bridge(BRIDGE_FOR_TORCH_PROFILER, True)


def _on_torch_profiler_stop() -> None:
    want_bridge(BRIDGE_FOR_TORCH_PROFILER, False)


def install_torch_profiler_hooks() -> None:
    """Follow torch's profiler starting and stopping (once torch is imported).

    torch calls ``_run_on_profiler_start`` / ``_run_on_profiler_stop`` of
    ``torch.autograd.profiler`` whenever its profiler is enabled or disabled; stepscope chains
    its own hooks after them, so that ``stepscope.record_function`` blocks also open torch's
    ``record_function`` while torch (not stepscope) records.
    """
    import torch.autograd.profiler as autograd_profiler

    start = getattr(autograd_profiler, "_run_on_profiler_start", None)
    stop = getattr(autograd_profiler, "_run_on_profiler_stop", None)
    if start is None or stop is None or getattr(start, "_stepscope_hook", False):
        return

    def hooked_start() -> None:
        start()
        _on_torch_profiler_start()

    def hooked_stop() -> None:
        stop()
        _on_torch_profiler_stop()

    hooked_start._stepscope_hook = True  # type: ignore[attr-defined]
    autograd_profiler._run_on_profiler_start = hooked_start
    autograd_profiler._run_on_profiler_stop = hooked_stop
    if getattr(autograd_profiler, "_is_profiler_enabled", False):
        _on_torch_profiler_start()
    _follow_execution_trace()


def _follow_execution_trace() -> None:
    """Bridge while torch's execution trace observer records, so that each
    ``stepscope.record_function`` block is a node of the execution trace, as torch's are.

    torch's ``ExecutionTraceObserver.start`` / ``stop`` call ``_enable_execution_trace_observer``
    / ``_disable_execution_trace_observer`` of ``torch.profiler.profiler``: stepscope chains its
    hooks after them, as for the profiler's start and stop.
    """
    module = sys.modules.get("torch.profiler.profiler")
    enable = getattr(module, "_enable_execution_trace_observer", None)
    disable = getattr(module, "_disable_execution_trace_observer", None)
    if enable is None or disable is None or getattr(enable, "_stepscope_hook", False):
        return

    def hooked_enable() -> None:
        enable()
        want_bridge(BRIDGE_FOR_EXECUTION_TRACE, True)

    def hooked_disable() -> None:
        disable()
        want_bridge(BRIDGE_FOR_EXECUTION_TRACE, False)

    hooked_enable._stepscope_hook = True  # type: ignore[attr-defined]
    module._enable_execution_trace_observer = hooked_enable  # type: ignore[union-attr]
    module._disable_execution_trace_observer = hooked_disable  # type: ignore[union-attr]


def advance_kineto_step(phase: str) -> None:
    """Keep torch's ``KinetoStepTracker`` in step with a profile ("start", "step", "stop").

    On-demand tracing (dynolog) counts steps through it, as with torch.profiler's ``step()``.
    """
    tracker = getattr(getattr(sys.modules.get("torch"), "autograd", None), "profiler", None)
    tracker = getattr(tracker, "KinetoStepTracker", None)
    if tracker is None:
        return
    if phase == "start":
        tracker.init_step_count(STEP_TRACKER_NAME)
    elif phase == "step":
        tracker.increment_step(STEP_TRACKER_NAME)
    else:
        tracker.erase_step_count(STEP_TRACKER_NAME)
