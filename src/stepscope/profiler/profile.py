"""``stepscope.profile``: torch.profiler's step-scheduled state machine, driving collectors.

Each step asks the schedule for an action; the transition between the previous and the new
action runs torch's action list (prepare on WARMUP, start on RECORD, stop and ``on_trace_ready``
after RECORD_AND_SAVE).  Every recording window yields one ``Trace``.  Beyond torch,
``flush_on_exit=True`` also hands a window to ``on_trace_ready`` when the loop ends during warmup.
A window's trace is built on the loop, or for ``trace_handler`` off it (``window_end.py``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, ClassVar, Literal

from stepscope import clock, forks, steps, steptables
from stepscope.activity import ProfilerActivity, coerce_activities
from stepscope.collectors import dataloader_workers, import_watch
from stepscope.collectors.annotations import AnnotationCollector, emit_span, record_function
from stepscope.collectors.base import Collector, WindowContext
from stepscope.collectors.compiled import register_profile_with_dynamo
from stepscope.collectors.torch import (
    DEVICE_NAMES,
    advance_kineto_step,
    install_torch_profiler_hooks,
)
from stepscope.config import config
from stepscope.extras import torch_installed
from stepscope.failures import failure_log
from stepscope.profiler import window_end
from stepscope.profiler.activity import default_activities, split_activity_filters
from stepscope.profiler.arguments import (
    checked_experimental_config,
    experimental_flag,
    gc_info_requested,
    metadata_key,
    parse_json,
)
from stepscope.profiler.collector_guard import collector_failed
from stepscope.profiler.deferred_sigchld import program_sigchld_deferred
from stepscope.profiler.events import EventList, function_events
from stepscope.profiler.execution_trace import ExecutionTraceCollector, ExecutionTraceObserver
from stepscope.profiler.flight_options import FlightRecorder, never_record
from stepscope.profiler.flight_recorder import Flight, flight_of
from stepscope.profiler.ranks import RankSync
from stepscope.profiler.schedule import ProfilerAction, Schedule, action_at, default_schedule
from stepscope.profiler.step_trigger import StepTrigger
from stepscope.profiler.summary import KeyAverages, key_averages
from stepscope.profiler.transitions import ActionMap, action_map
from stepscope.profiler.writer import WindowWriter, release_sigterm
from stepscope.report.collapsed import collapsed_from_spans, write_collapsed
from stepscope.trace.chrome_writer import WriteStats, write_chrome_trace
from stepscope.trace.model import Trace, TraceBuilder
from stepscope.trace.names import OWN_WORK_FRAME

__all__ = ["profile"]

log = logging.getLogger("stepscope")
_failures = failure_log("collectors")

STEP_SPAN_PREFIX = "ProfilerStep#"
DEVICE_ACTIVITIES = frozenset(
    {
        ProfilerActivity.CUDA,
        ProfilerActivity.XPU,
        ProfilerActivity.MTIA,
        ProfilerActivity.HPU,
        ProfilerActivity.PrivateUse1,
    }
)
RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


class profile:
    """Step-scheduled profiler; use as a context manager or with ``start()/step()/stop()``."""

    _left_in_child = False
    """True in a child forked while this profile ran: there it records nothing."""
    gives_way = False
    """Set on the listener's profile (``stepscope.listen``): the program's own profile may
    start while it runs, and then it pauses (see ``_pause``) until that one stops."""
    _paused = False
    on_pause: Callable[[], None] | None = None
    """Called (on the program's thread) when this profile gives way, before its window ends."""

    __signature__: ClassVar[inspect.Signature]
    """The class's signature (``help()``, editors): ``__init__``'s, not ``__new__``'s."""

    def __new__(cls, *args: Any, **kwargs: Any) -> profile:
        # A __new__ of its own, for torch.compile to substitute (collectors/compiled.py).
        return object.__new__(cls)

    def __init__(
        self,
        *,
        activities: Iterable[object] | None = None,
        schedule: Schedule | None = None,
        on_trace_ready: Callable[[profile], Any] | None = None,
        record_shapes: bool = False,
        profile_memory: bool | Literal["exact"] = False,
        with_stack: bool = False,
        with_flops: bool = False,
        with_modules: bool = False,
        experimental_config: Any = None,
        execution_trace_observer: Any = None,
        acc_events: bool = False,
        use_cuda: bool | None = None,
        custom_trace_id_callback: Callable[[], str] | None = None,
        post_processing_timeout_s: float | None = None,
        flush_on_exit: bool = True,
        collectors: Iterable[Collector] = (),
        max_annotation_spans: int = 2_000_000,
        sampling_rate_hz: float = 100.0,
        torch_ops: bool | None = None,
        step_on: str | Callable[..., Any] | None = None,
        tracer_options: Mapping[str, Any] | None = None,
        strict: bool | None = None,
        step_tables: str | os.PathLike[str] | steptables.StepTables | None = None,
        flight_recorder: int | FlightRecorder | None = None,
        dataloader_workers: bool = True,
        max_pending_windows: int = 4,
    ) -> None:
        plain, self.activity_filters = split_activity_filters(activities)
        self.activities = coerce_activities(plain) if plain is not None else default_activities()
        if use_cuda is not None:
            warnings.warn(
                "`use_cuda` is deprecated, use `activities` argument instead",
                FutureWarning,
                stacklevel=2,
            )
            if use_cuda:
                self.activities.add(ProfilerActivity.CUDA)
            else:
                self.activities.discard(ProfilerActivity.CUDA)
        if post_processing_timeout_s is not None and post_processing_timeout_s < 0:
            raise ValueError("post_processing_timeout_s must be non-negative")
        if custom_trace_id_callback is not None and not callable(custom_trace_id_callback):
            raise TypeError(
                f"custom_trace_id_callback must be callable () -> str, got "
                f"{custom_trace_id_callback!r}"
            )
        self.custom_trace_id_callback = custom_trace_id_callback
        """Called when each window is prepared; its string is the window's ``trace_id``."""
        self.post_processing_timeout_s = post_processing_timeout_s
        """Seconds ``events()`` may spend building events; past it the list is partial."""
        self._trace_id: str | None = None
        experimental_config = checked_experimental_config(experimental_config, with_stack)
        if schedule is not None and not callable(schedule):
            raise TypeError(f"schedule must be callable (step -> ProfilerAction), got {schedule!r}")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError(f"on_trace_ready must be callable, got {on_trace_ready!r}")
        self.flight: Flight | None = flight_of(flight_recorder, strict)
        """The always-on flight recorder (``flight_recorder=``), or None."""
        if schedule is None and self.flight is not None:
            schedule = never_record  # a flight recorder without a schedule: only the ring
        self.schedule: Schedule = schedule or default_schedule
        self._step_zero_at: int | None = None
        """Without a schedule, when step 0 began: its span is kept only once ``step()`` is
        called (torch records no ``ProfilerStep`` without a schedule; a loop that steps gets
        its steps)."""
        self._mark_steps_from_start = schedule is not None
        self.on_trace_ready = on_trace_ready
        self.record_shapes = record_shapes
        if profile_memory not in (True, False, "exact"):
            raise ValueError(
                f"profile_memory must be True, False or 'exact', not {profile_memory!r}"
            )
        self.profile_memory = profile_memory  # True: sampled sites; "exact": tracemalloc's
        self.with_stack = with_stack
        self.with_flops = with_flops
        self.with_modules = with_modules
        self.experimental_config = experimental_config
        self.execution_trace_observer = (
            execution_trace_observer or ExecutionTraceObserver.build_execution_trace_obs_from_env()
        )
        """The observer given, or (as torch) one from ``ENABLE_PYTORCH_EXECUTION_TRACE=1``."""
        if not isinstance(acc_events, bool):
            raise TypeError(f"acc_events must be a bool, got {acc_events!r}")
        self.acc_events = acc_events
        self.flush_on_exit = flush_on_exit
        self.torch_ops = torch_installed() if torch_ops is None else torch_ops
        """Whether torch's operators are recorded: by default whenever the program has imported
        torch when a window starts, or imports it during one."""
        self.strict = strict
        """Re-raise failures of this profile's collectors and trace handler: None (the default)
        follows ``config.strict``; True or False decides for this profile and every collector it
        builds."""
        self.tracer_options = dict(tracer_options or {})
        """Options of the function tracer for ``with_stack`` (``PythonTracerCollector``'s:
        ``event_budget``, ``include``, ``exclude``, ``max_depth``, ``min_duration_ns``, ...)."""
        self.sampling_rate_hz = sampling_rate_hz
        """Mean samples per second of ``ProfilerActivity.SAMPLING`` (exponentially jittered)."""
        self.dataloader_workers = dataloader_workers  # follow torch DataLoaders' workers
        trigger = StepTrigger(step_on, self.step, strict=strict) if step_on is not None else None
        self._step_trigger = trigger
        self.step_tables = steptables.step_tables_of(step_tables, strict)
        self.collectors: list[Collector] = [
            AnnotationCollector(max_spans=max_annotation_spans, record_shapes=record_shapes)
        ]
        self.collectors += self._requested_collectors() + self.step_tables.collectors()
        if strict is not None:
            for built in self.collectors:
                built.strict = strict
        for extra in collectors:
            if not isinstance(extra, Collector):
                raise TypeError(f"collectors must be Collector instances, got {extra!r}")
            self.collectors.append(extra)
        self.step_times = self.step_tables.step_times()  # with the tables' phase columns
        """Every step's start and end, recorded or not, and each collector's hook time."""
        self.step_num = 0
        self.current_action = action_at(self.schedule, 0)
        self.preset_metadata: dict[str, Any] = {}
        self._window_metadata: dict[str, Any] = {}
        self._ctx: WindowContext | None = None
        self._window_index = 0
        self._window_first_step = 0
        self._ranks = RankSync(strict)
        self._step_span: Any = None
        self._traces: list[Trace] = []
        self._broken: set[int] = set()
        self.trace_files: list[str] = []
        """Paths written by ``export_chrome_trace`` (e.g. through ``trace_handler``)."""
        self._action_map: dict[tuple[int, int | None], list[Callable[[], Any]]]
        # Keyed by the actions' plain values: hashing an Enum runs Python code, which would show
        # up in the user's with_stack results.
        self._action_map = {
            (prev._value_, cur._value_ if cur is not None else None): actions
            for (prev, cur), actions in self._build_action_map().items()
        }
        self._edge_keys = {key for key, actions in self._action_map.items() if actions}  # edges
        self._writer = WindowWriter(max_pending_windows)  # saves windows off the loop
        self._stopped: window_end.StoppedWindow | None = None
        self._edge, self._skipping = -1, False

    # -- configuration -------------------------------------------------------------------------
    def _requested_collectors(self) -> list[Collector]:
        torch_activities = self.activities & ({ProfilerActivity.CPU} | DEVICE_ACTIVITIES)
        torch_options = [
            flag for flag in ("record_shapes", "with_flops", "with_modules") if getattr(self, flag)
        ]
        if self.experimental_config is not None:
            torch_options.append("experimental_config")
        found: list[Collector] = []
        if self.torch_ops and torch_activities:
            from stepscope.collectors.torch import TorchCollector

            found.append(
                TorchCollector(
                    torch_activities,
                    record_shapes=self.record_shapes,
                    profile_memory=bool(self.profile_memory),
                    with_flops=self.with_flops,
                    with_modules=self.with_modules,
                    module_frames=self.with_modules and self.with_stack,
                    experimental_config=self.experimental_config,
                    activity_filters=self.activity_filters,
                    post_processing_timeout_s=self.post_processing_timeout_s,
                    torch_events=not window_end.saves_off_loop(self),
                )
            )
        else:
            devices = sorted(a.name for a in self.activities & DEVICE_ACTIVITIES)
            needs = [f"activities {', '.join(devices)}"] if devices else []
            needs += [f"{flag}" for flag in torch_options]
            if self.activity_filters:
                needs.append("activity filters (dict activities)")
            if needs:
                what = (
                    "leave torch_ops at its default"
                    if torch_installed()
                    else "install torch (pip install 'stepscope[torch]')"
                )
                raise ValueError(f"{', '.join(needs)} record through torch's profiler: {what}")
        if self.profile_memory:
            from stepscope.collectors.memory import MemoryCollector

            torch_collector = found[0] if found else None
            found.append(MemoryCollector(torch_collector, exact=self.profile_memory == "exact"))
        if gc_info_requested(self.experimental_config):
            from stepscope.collectors.gc import GcCollector

            found.append(GcCollector())
        if self.execution_trace_observer is not None:
            # First in the list: started before, and stopped after, every other collector.
            found.insert(0, ExecutionTraceCollector(self.execution_trace_observer))
        if self.with_stack or ProfilerActivity.PYTHON in self.activities:
            from stepscope.collectors.python import PythonTracerCollector

            found.append(PythonTracerCollector(**self.tracer_options))
        if ProfilerActivity.SAMPLING in self.activities:
            from stepscope.collectors.sampler import SamplerCollector

            found.append(SamplerCollector(self.sampling_rate_hz))
        found += dataloader_workers.collectors_for(self.dataloader_workers, self.sampling_rate_hz)
        return found

    def _build_action_map(self) -> ActionMap:
        return action_map(
            prepare=self.prepare_trace,
            start=self.start_trace,
            stop=self.stop_trace,
            ready=self._trace_ready,
            ended_early=self._mark_ended_early,
            ended_in_warmup=self._mark_ended_in_warmup if self.flush_on_exit else None,
        )

    # -- the loop-facing API -------------------------------------------------------------------
    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and self.flight is not None:  # flight recorder: dumps, never raises
            self.flight.program_raised(exc)
        self.stop()

    def start(self) -> None:
        """Begin at step 0 (runs the transition from NONE to the schedule's first action)."""
        global _active, _paused_behind
        if _active is not None and _active is not self:
            if self.gives_way:  # the listener, started inside the program's own profile
                self._paused, _paused_behind = True, self
            elif _active.gives_way:
                _active._pause()
            else:
                raise RuntimeError(
                    "another stepscope profile is already running in this process; stop it "
                    "first (stepscope runs one profile at a time)"
                )
        if not self._paused:
            _active = self
        try:
            self.step_tables.begin()  # before step_on's: its optimizer hook must run first
        except BaseException:
            _release(self)  # (the listener's profile, paused for this one, resumes)
            raise
        try:
            joined = self.step_num if self._paused else self._ranks.join(self.step_num)
            if joined != self.step_num:  # a rank that started late takes the leader's numbering
                self.step_num, self.current_action = joined, action_at(self.schedule, joined)
            for collector in self.collectors:  # what must see the program before any window
                if collector is not self.step_tables:  # (begun above, first)
                    self._guarded(collector, "begin", collector.begin)
            if self._step_trigger is not None:
                self._step_trigger.install()
            if not self._paused:
                steps.set_step(self.step_num)
                advance_kineto_step("start")
            self.step_times.first_step = self.step_num
            self.step_tables.follow(self.step_times, lambda: self.step_num)
            self._transit(ProfilerAction.NONE, self.current_action)
            self._open_step_span()
            if self.flight is not None:
                self.flight.start(self)
        except BaseException:
            # a start that fails (a strict collector, a bad schedule) leaves no profile running
            with contextlib.suppress(Exception):
                self.stop()
            _release(self)
            raise

    def step(self) -> None:
        """Mark the end of the current step and the start of the next one."""
        if self._left_in_child:
            return
        if self._paused:  # given way to the program's own profile: count, touch nothing shared
            self.step_num += 1
            self._ranks.publish(self.step_num)
            return
        self._close_step_span(stepping=True)
        self._mark_steps_from_start = True
        previous = self.current_action
        flight = self.flight
        if flight is not None:
            flight.step_ended(self.step_num, previous._value_)
        self.step_num += 1
        action = action_at(self.schedule, self.step_num)
        if flight is not None:  # a trigger's armed window overrides NONE steps
            action = flight.action(self.step_num, action)
        self.current_action = action
        steps.set_step(self.step_num)
        self._ranks.publish(self.step_num)
        advance_kineto_step("step")
        if previous is ProfilerAction.RECORD and action in RECORDING and self._ctx is not None:
            ctx, step = self._ctx, self.step_num
            with record_function(OWN_WORK_FRAME):  # not the self time of a hook it runs in
                for collector in self.collectors:
                    on_step = functools.partial(collector.on_step, ctx, step)
                    self._guarded(collector, "on_step", on_step)
        if (previous._value_, action._value_) in self._edge_keys:
            self._edge = self.step_times.mark_edge()
            self._transit(previous, action)
        elif self._writer.pending == 0:
            release_sigterm()
        self._open_step_span()
        if flight is not None:
            flight.step_began()
        self._writer.raise_error()

    def stop(self) -> None:
        """End profiling: closes the window in progress (see ``flush_on_exit``)."""
        if self._left_in_child:
            return
        # The steps below run last to first, each one even when one before it raised: the
        # program's own signal handler (torch's SIGCHLD for a dead worker) can raise anywhere,
        # and a profile left registered would refuse every later one in the process.
        with contextlib.ExitStack() as cleanup:
            cleanup.enter_context(program_sigchld_deferred())  # torch's raises: after the stop
            cleanup.enter_context(self._writer.waited_for())  # the window ending here is waited for
            cleanup.callback(release_sigterm)
            cleanup.callback(_release, self)
            cleanup.callback(self._leave_the_step_counter)
            cleanup.callback(self._ranks.close)
            for collector in reversed(self.collectors):
                cleanup.callback(self._guarded, collector, "close", collector.close)
            cleanup.callback(self._writer.drain, "the profile stopped")
            if self.flight is not None:
                cleanup.callback(self.flight.stop)
            if self._step_trigger is not None:
                self._step_trigger.remove()
            self._close_step_span()
            if (self.current_action._value_, None) in self._edge_keys:
                self._edge = self.step_times.mark_edge()
            self._transit(self.current_action, None)
        self._writer.raise_error()

    def _leave_the_step_counter(self) -> None:
        if not self._paused:  # a paused profile leaves the running one's step alone
            steps.set_step(None)
            advance_kineto_step("stop")

    windows_skipped = property(
        lambda self: self._writer.skipped, doc="Windows left out: ``max_pending_windows`` waited."
    )

    def _pause(self) -> None:
        """Give way to the program's own profile: a window in progress ends here (its owner,
        ``on_pause``, says what becomes of it); steps are only counted until ``_resume``."""
        global _active, _paused_behind
        self._paused, _paused_behind = True, self
        if _active is self:
            _active = None
        try:
            if self.on_pause is not None:
                self.on_pause()
            self._close_step_span()
            self._transit(self.current_action, None)
        finally:
            self.current_action = ProfilerAction.NONE
            steps.set_step(None)
            advance_kineto_step("stop")

    def _resume(self) -> None:
        """The program's own profile stopped: count steps as before, from the next boundary."""
        self._paused = False
        self.current_action = action_at(self.schedule, self.step_num)
        steps.set_step(self.step_num)
        advance_kineto_step("start")
        self.step_times.begin(self.current_action._value_)

    def _transit(self, previous: ProfilerAction, current: ProfilerAction | None) -> None:
        key = (previous._value_, current._value_ if current is not None else None)
        try:
            for action in self._action_map.get(key, ()):
                action()
        finally:  # stopped without on_trace_ready: built, kept
            self._finish_window(call_handler=False)

    def _open_step_span(self) -> None:
        self.step_times.begin(0 if self._skipping else self.current_action._value_)
        if self.current_action not in RECORDING or self._skipping:
            return
        if not self._mark_steps_from_start:
            self._step_zero_at = clock.now_ns()
            return
        span = record_function(f"{STEP_SPAN_PREFIX}{self.step_num}")
        span.__enter__()
        self._step_span = span

    def _close_step_span(self, stepping: bool = False) -> None:
        (self.step_times.end if stepping else self.step_times.cut_short)()
        span, self._step_span = self._step_span, None
        if span is not None:
            span.__exit__(None, None, None)
        started, self._step_zero_at = self._step_zero_at, None
        if started is not None and stepping:
            emit_span(f"{STEP_SPAN_PREFIX}{self.step_num}", started, clock.now_ns())

    # -- window actions ------------------------------------------------------------------------
    def _guarded(
        self,
        collector: Collector,
        phase: str,
        fn: Callable[[], Any],
        window: window_end.StoppedWindow | None = None,
        suffix: str = "",
    ) -> None:
        """Run a collector hook (of a stopped ``window`` when given); a failure switches the
        collector off for the window (``collector_failed``)."""
        broken, ctx = (self._broken, self._ctx) if window is None else (window.broken, window.ctx)
        if id(collector) in broken and phase != "close":
            return
        try:
            self.step_times.timed(collector.name + suffix, fn)
        except Exception as exc:
            collector_failed(collector, phase, exc, broken, ctx, self.strict, id(self))

    def prepare_trace(self) -> None:
        """Create the next window and let collectors get ready (WARMUP)."""
        if not window_end.skip_window(self):
            self._new_window()

    def _new_window(self) -> WindowContext:
        self._skipping = False
        self._broken.clear()
        ctx = self._ctx = WindowContext(
            window=self._window_index, loop_waits=self._writer.waited_on
        )
        self._trace_id = self._make_trace_id()
        ctx.metadata["trace_id"] = self._trace_id
        if self._ranks.record is not None:
            ctx.metadata["stepscope_rank_sync"] = self._ranks.record
        self._window_first_step = self.step_num
        for collector in self.collectors:
            self._guarded(collector, "prepare", functools.partial(collector.prepare, ctx))
        return ctx

    def start_trace(self) -> None:
        """Start recording the window (RECORD)."""
        if self._skipping or (self._ctx is None and window_end.skip_window(self)):
            return
        ctx = self._ctx if self._ctx is not None else self._new_window()
        clock.refine()
        self._window_first_step = self.step_num
        if self.flight is not None:  # the window's collectors take annotations (and samples)
            self.flight.window_starts(any(c.name == "sampler" for c in self.collectors))
        ctx.start_ns = clock.now_ns()
        for collector in self.collectors:
            self._guarded(collector, "start", functools.partial(collector.start, ctx))

    def stop_trace(self) -> None:
        """Stop recording; the window's ``Trace`` is built next (see ``_finish_window``)."""
        if self._skipping:  # a window left out: nothing was recorded, nothing is handed over
            self._window_index += 1
            return
        ctx = self._ctx
        if ctx is None:
            return
        ctx.stopping_ns = clock.now_ns()
        for collector in reversed(self.collectors):
            self._guarded(collector, "stop", functools.partial(collector.stop, ctx))
        if self.flight is not None:
            self.flight.window_stopped()
        ctx.end_ns = clock.now_ns()
        if self._window_index == 0:  # clocks compared once, after the first window stopped
            record = self._ranks.first_window_end(self._window_first_step, self.step_num)
            if record is not None:
                ctx.metadata["stepscope_rank_sync"] = record
        self._stopped = window_end.stopped(self, ctx, self._edge)
        self._window_index += 1
        self._ctx = None

    def _mark_ended_early(self) -> None:
        if self._ctx is not None:
            self._ctx.metadata["stepscope_window_complete"] = False

    def _mark_ended_in_warmup(self) -> None:
        if self._ctx is not None:
            self._ctx.metadata["stepscope_window_complete"] = False
            self._ctx.metadata["stepscope_window_note"] = "the loop ended during warmup"

    def _trace_ready(self) -> None:
        if self._skipping:
            self._skipping = False
            return
        if self.flight is not None and self.flight.window_ready(self):  # a trigger's window
            return  # (its file asked for the trace: the window was built for it)
        if self._stopped is not None:
            self._finish_window(call_handler=True)
        elif self.on_trace_ready is not None:
            self.on_trace_ready(self)

    def _finish_window(self, call_handler: bool) -> None:
        """Build the stopped window's trace, hand it to ``on_trace_ready`` (``window_end``)."""
        window, self._stopped = self._stopped, None
        if window is not None:
            window_end.finish(self, window, self.on_trace_ready if call_handler else None)

    def _make_trace_id(self) -> str:
        if self.custom_trace_id_callback is None:
            return f"{uuid.uuid4().int:032X}"
        value = self.custom_trace_id_callback()
        if not isinstance(value, str):
            raise TypeError(f"custom_trace_id_callback returned {value!r}; it must return a str")
        return value

    def set_custom_trace_id_callback(self, callback: Callable[[], str]) -> None:
        """Set the trace id generator, called when each window is prepared."""
        if not callable(callback):
            raise TypeError(f"callback must be callable () -> str, got {callback!r}")
        self.custom_trace_id_callback = callback

    def get_trace_id(self) -> str | None:
        """The id of the current (or last) window's trace."""
        return self._trace_id

    # -- metadata ------------------------------------------------------------------------------
    def add_metadata(self, key: str, value: str) -> None:
        """Add a string entry to the trace metadata (this window, or the next one)."""
        self._window_metadata[metadata_key(key)] = str(value)

    def add_metadata_json(self, key: str, value: str) -> None:
        """Add an entry whose value is JSON text (rejected with a clear error if invalid)."""
        self._window_metadata[metadata_key(key)] = parse_json(key, value)

    def preset_metadata_json(self, key: str, value: str) -> None:
        """Add a JSON entry to the metadata of every window."""
        self.preset_metadata[metadata_key(key)] = parse_json(key, value)

    # -- results -------------------------------------------------------------------------------
    @property
    def traces(self) -> list[Trace]:
        """Recorded windows: the last one, or all of them with ``acc_events=True``."""
        self._saved()
        return list(self._traces)

    def _saved(self) -> None:
        """Wait for the windows being saved off the loop (a stopped one is handed over now)."""
        if self._stopped is not None:
            self._finish_window(call_handler=False)
        if self._writer.pending:
            self._writer.wait(config.save_wait_s)
        self._writer.raise_error()

    def _require_traces(self, what: str) -> list[Trace]:
        self._saved()
        if not self._traces:
            raise RuntimeError(
                f"{what}: no window has been recorded yet (the schedule has not reached a RECORD "
                "step, or the profile has not stopped)"
            )
        return self._traces

    def trace(self) -> Trace:
        """The recorded trace (all windows merged when ``acc_events=True``)."""
        traces = self._require_traces("trace()")
        if len(traces) == 1:
            return traces[0]
        merged = TraceBuilder(base_time_ns=traces[0].base_time_ns)
        for t in traces:
            merged.add_trace(t)
        return merged.build()

    @property
    def use_device(self) -> str | None:
        """The device recorded (``"cuda"``, ``"xpu"``...), as torch's ``use_device``."""
        for activity, name in DEVICE_NAMES.items():
            if activity in self.activities:
                return name
        return None

    def events(self) -> EventList:
        """Every span of the recorded window(s) as torch's ``FunctionEvent`` objects (µs)."""
        if getattr(self.experimental_config, "trace_only", False):
            raise RuntimeError(
                "events() is not available when trace_only=True in ExperimentalConfig. "
                "Use export_chrome_trace() instead."
            )
        return function_events(
            self._require_traces("events()"),
            use_device=self.use_device,
            profile_memory=bool(self.profile_memory),
            with_flops=self.with_flops,
            timeout_s=self.post_processing_timeout_s,
            overload_names=experimental_flag(self.experimental_config, "capture_overload_names"),
        )

    def key_averages(
        self,
        group_by_input_shape: bool = False,
        group_by_stack_n: int = 0,
        group_by_overload_name: bool = False,
    ) -> KeyAverages:
        """Spans grouped as torch groups events; ``.table()`` prints torch's table."""
        if getattr(self.experimental_config, "trace_only", False):
            raise RuntimeError(
                "key_averages() is not available when trace_only=True in ExperimentalConfig. "
                "Use export_chrome_trace() instead."
            )
        return key_averages(
            self._require_traces("key_averages()"),
            group_by_input_shape,
            group_by_stack_n,
            group_by_overload_name,
            use_device=self.use_device,
            profile_memory=bool(self.profile_memory),
            with_flops=self.with_flops,
            overload_names=experimental_flag(self.experimental_config, "capture_overload_names"),
        )

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> WriteStats:
        """Write the recorded trace as a Chrome/Perfetto JSON file (gzip if ``.gz``)."""
        stats = write_chrome_trace(self.trace(), path)
        self.trace_files.append(stats.path)
        return stats

    def export_memory_timeline(
        self, path: str | os.PathLike[str], device: str | None = None
    ) -> str:
        """Write the memory timeline: ``.html``, ``.json``, ``.json.gz`` or ``.raw.json.gz``."""
        from stepscope.profiler.memory_timeline import export_memory_timeline

        self._saved()
        return export_memory_timeline(self, path, device)

    def export_stacks(
        self, path: str | os.PathLike[str], metric: str = "self_cpu_time_total"
    ) -> int:
        """Write collapsed stacks (``a;b;c value`` in µs); returns the number of stacks."""
        stacks = collapsed_from_spans(self._require_traces("export_stacks()"), metric)
        if not stacks:
            raise ValueError(
                f"export_stacks: the recorded window(s) hold no time for metric {metric!r}"
            )
        return write_collapsed(stacks, path)


_active: profile | None = None


def _leave_in_child(prof: profile) -> None:
    """Drop the parent's window in a forked child: collectors stop, nothing is saved there."""
    prof._left_in_child = True
    hooks: list[Callable[[], Any]] = [c.after_fork_in_child for c in prof.collectors]
    if prof._step_trigger is not None:
        hooks.insert(0, prof._step_trigger.remove)
    for hook in hooks:
        try:
            hook()
        except Exception as exc:  # raising in a fork hook helps no one
            log.warning("stepscope: in a forked child, %r failed (%s: %s)", hook, type(exc), exc)


def _after_fork_in_child() -> None:
    """A forked child starts clean: no window, no tracing, free to start its own profile."""
    global _active, _paused_behind
    prof, _active = _active, None
    behind, _paused_behind = _paused_behind, None
    for left in (prof, behind):
        if left is not None:
            _leave_in_child(left)


_init_signature = inspect.signature(profile.__init__)
profile.__signature__ = _init_signature.replace(
    parameters=list(_init_signature.parameters.values())[1:],  # without self
    return_annotation=inspect.Signature.empty,
)
forks.after_fork_in_child(_after_fork_in_child)
import_watch.when_imported("torch", install_torch_profiler_hooks)
register_profile_with_dynamo(profile)


_paused_behind: profile | None = None
"""The listener's profile while it gives way to the program's own (``profile.gives_way``)."""


def _release(prof: profile) -> None:
    global _active, _paused_behind
    if _paused_behind is prof:
        _paused_behind = None
        return
    if _active is prof:
        _active = None
        waiting, _paused_behind = _paused_behind, None
        if waiting is not None:
            _active = waiting
            try:
                waiting._resume()
            except Exception as exc:  # the listener's profile: the program's stop goes on
                _failures.report("collector_error", "the listener's profile resuming", exc,
                                 strict=waiting.strict)  # fmt: skip


def active_profile() -> profile | None:
    """The profile running in this process, if any."""
    return _active
