"""The flight recorder: an always-on ring of the last N steps, dumped as a trace when a step is
slow, the program raises, no step ends for a while, on SIGUSR1 or ``stepscope attach --dump``.

``profile(flight_recorder=N)`` makes a ``Flight``.  Between windows it keeps, in bounded memory:

- one row per step (number, start, end, thread) in a ``deque`` of ``N + 1`` rows, appended by
  ``step_ended`` from the profile's ``step()`` (one clock read, no lock, no I/O);
- the ``record_function`` spans that ended during each step: the annotation backend records
  into the recorder's list all along, and ``step_ended`` moves what is there into the step's
  row (at most ``max_spans`` in the ring, more are counted as dropped);
- 100 Hz stack samples of every thread from the in-process sampler (signal mode where it
  works), drained every ``DRAIN_S``; on its thread, once a second, the samples older than the
  ring's first step are forgotten (``StackSampler.forget_before``).

A step over ``slow_factor`` times the rolling median (and ``slow_min_s``) hands a snapshot of the
ring to the recorder's thread, which writes it (``flight_dump``); the watchdog on that thread
dumps the ring and every thread's stack when no step ends for ``hang_s``; an exception that
leaves the profile (or the program under ``stepscope run``) is dumped on the spot.  Dumps go
through the same Chrome writer as windows, say why in ``stepscope_flight`` and in one stderr
line, and are rate-limited: each automatic trigger at most once per ``spacing`` steps, at most
``max_dumps`` in all; the others are counted as suppressed.  With ``window_steps`` a trigger also
records the next steps as a full window of the profile's own recording options.  While a window
of the profile records, the recorder's annotations (and its sampler, when the window samples)
give way to the window's.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope import clock
from stepscope.atomic import make_directory
from stepscope.collectors.annotations import SpanTuple, default_backend
from stepscope.collectors.sampler import Sampler, SamplerData
from stepscope.failures import failure_log
from stepscope.forks import after_fork_in_child
from stepscope.profiler.flight_dump import Row, Snapshot, build_dump, thread_stacks
from stepscope.profiler.flight_options import FlightRecorder, flight_recorder_of
from stepscope.profiler.flight_watch import SignalTrigger, Watch
from stepscope.profiler.handlers import default_worker_name
from stepscope.profiler.schedule import ProfilerAction
from stepscope.trace.chrome_writer import write_chrome_trace

if TYPE_CHECKING:
    from stepscope.profiler.profile import profile

__all__ = ["Flight", "FlightError", "active_flight", "flight_of"]

log = logging.getLogger("stepscope")
_failures = failure_log("flight")

MEDIAN_STEPS = 64
"""Recent steps whose median is the slow-step baseline."""
MEDIAN_EVERY = 8
"""Steps between two computations of that median (and the first one)."""
DRAIN_S = 0.1
"""How often the sampler's thread drains its signal rings (the windows' sampler: 10 ms)."""
TRIM_EVERY_NS = 1_000_000_000
"""How often samples older than the ring are forgotten (each time moves the rest)."""
MAX_STACK_NODES = 200_000
"""Distinct stack nodes the sampler may intern (about 60 bytes each) before it is restarted:
a program that keeps making new code (``exec`` per step) would grow them without end."""
TICK_S = 0.25
"""Longest sleep of the recorder's thread: how late a SIGUSR1 (or a hang) is seen."""
STOP_TIMEOUT_S = 30.0
"""How long ``stop`` waits for a dump being written."""


class FlightError(RuntimeError):
    """A dump that was asked for and not written; the message says why, in one line."""


@dataclass
class _Armed:
    """A full window a trigger asked for: warm-up at ``first``, then ``steps`` recorded."""

    reason: str
    step: int
    first: int | None = None


def _span_count(row: Row) -> int:
    return len(row[4])


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3g} ms" if ns < 1e10 else f"{ns / 1e9:.3g} s"


class Flight:
    """One profile's running flight recorder (see the module doc)."""

    def __init__(self, options: FlightRecorder, *, strict: bool | None = None) -> None:
        self.options = options
        self.strict = strict
        self._keep = options.steps + 1
        self._rows: collections.deque[Row] = collections.deque(maxlen=self._keep)
        self._sink: list[SpanTuple] = []
        self._ring_spans = 0
        self._spans_dropped = 0
        self._open_step = 0
        self._open_start = 0
        self._loop_tid = 0
        self._last_end_ns = 0
        self._durations: collections.deque[int] = collections.deque(maxlen=MEDIAN_STEPS)
        self._median_ns: int | None = None
        self._threshold_ns = sys.maxsize
        self._until_median = MEDIAN_EVERY
        self._annotating = False
        self._in_window = False
        self._sampler: Sampler | None = None
        self._old_samples: list[SamplerData] = []
        self._sampler_info: dict[str, Any] = {}
        self._trim_at = 0
        self._sample_floor = 0
        self._pending_floors: list[int] = []
        self._samples_forgotten = 0
        self._sampler_restarts = 0
        self._restart_sampler = False
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._writing = 0
        self._last_auto: dict[str, int] = {}
        self._started_dumps = 0
        self.dumps: list[str] = []
        """Every dump and triggered window written by this recorder."""
        self.suppressed: dict[str, int] = {}
        """Triggers that wrote nothing (rate limit, ``max_dumps``), by reason."""
        self.notes: dict[str, str] = {}
        """What the recorder could not do here (a signal handler, ...), in words."""
        self._armed: _Armed | None = None
        self._window_armed: _Armed | None = None
        self._hang_seen = -1
        self._signalled = False
        self._raised = False
        self._running = False
        self._pid = os.getpid()
        self._watch: Watch | None = None
        self._signal: SignalTrigger | None = None
        self._listener: Any = None
        self._profile: profile | None = None
        self._out = Path(options.out)
        make_directory(self._out, "flight_recorder", "flight recorder directory")

    # -- lifetime (the program's thread) --------------------------------------------------------
    def start(self, prof: profile) -> None:
        """Begin recording (the profile has started, its first step is open); a failure here
        is counted and leaves the program running without a recorder."""
        try:
            self._start(prof)
        except Exception as exc:
            self._failed("start_error", "starting the flight recorder", exc,
                         then="this profile runs without a flight recorder")  # fmt: skip
            with contextlib.suppress(Exception):
                self.stop()
            prof.flight = None

    def _start(self, prof: profile) -> None:
        global _active
        self._profile = prof
        now = clock.now_ns()
        self._open_step, self._open_start = prof.step_num, now
        self._last_end_ns, self._loop_tid = now, threading.get_native_id()
        self._running = True
        _active = self
        if not self._in_window:
            self._record_annotations()
            self._start_sampler()
        hang = self.options.hang_s
        tick = min(max(hang / 10, 0.05), TICK_S) if hang else TICK_S
        self._watch = Watch(self.tick, tick)
        self._watch.start()
        if self.options.on_signal:
            trigger = SignalTrigger(self._on_signal)
            why = trigger.install()
            if why:
                self.notes["signal"] = f"SIGUSR1 does not dump: {why}"
            else:
                self._signal = trigger
        if self.options.attachable:
            self._listen()

    def _listen(self) -> None:
        from stepscope.profiler.control_listener import Listener, running_listener

        if running_listener() is None:  # else that one serves --dump too
            self._listener = Listener(self).start()

    def stop(self) -> None:
        """Stop recording: dumps being written are finished, everything is put back."""
        global _active
        if not self._running:
            return
        self._running = False
        if _active is self:
            _active = None
        if self._signal is not None:
            self._signal.remove()
        if self._signalled and self._watch is not None:  # one the thread had not seen yet
            self._signalled = False
            self._watch.submit(lambda: self._dump_from_thread("signal", "SIGUSR1 received"))
        if self._watch is not None and not self._watch.stop(STOP_TIMEOUT_S):
            self.notes["stop"] = f"a dump was still being written after {STOP_TIMEOUT_S:g} s"
        self._stop_annotations()
        self._stop_sampler()
        if self._listener is not None:
            self._listener.close()
        if self.suppressed:
            counts = ", ".join(f"{n} {reason}" for reason, n in sorted(self.suppressed.items()))
            self._say(f"{sum(self.suppressed.values())} dump(s) suppressed ({counts})")

    def after_fork_in_child(self) -> None:
        """In a forked child: record nothing, keep nothing (its threads stayed in the parent)."""
        self._running = False
        if self._annotating:
            self._annotating = False
            with contextlib.suppress(Exception):
                default_backend.stop()
        self._sink.clear()
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.forget_in_child()
        self._rows.clear()
        self._listener = None  # the parent's socket: never removed by a child

    # -- the step hooks (the program's thread, every step) -------------------------------------
    def step_ended(self, step: int, kind: int) -> None:
        """Step ``step`` ends now (``kind``: its schedule action's value, 0 for NONE)."""
        try:
            now = clock.now_ns()
            rows = self._rows
            if len(rows) == self._keep:
                self._ring_spans -= _span_count(rows[0])
            sink = self._sink
            n = len(sink)
            spans: tuple[SpanTuple, ...] | list[SpanTuple] = ()
            if n:
                spans = sink[:n]
                del sink[:n]  # a span another thread appends meanwhile stays for the next step
                room = self.options.max_spans - self._ring_spans
                if n > room:
                    spans = spans[: max(room, 0)]
                    self._spans_dropped += n - len(spans)
                self._ring_spans += len(spans)
            tid = threading.get_native_id()
            rows.append((step, self._open_start, now, tid, spans))
            self._last_end_ns, self._loop_tid, self._open_step = now, tid, step + 1
            if kind == 0:  # a window's steps are slower by design: not judged, not the baseline
                duration = now - self._open_start
                if duration > self._threshold_ns:
                    self._slow(step, duration)
                self._durations.append(duration)
                self._until_median -= 1
                if not self._until_median:
                    self._new_median()
        except Exception as exc:
            self._failed("step_error", "a step hook", exc)

    def step_began(self) -> None:
        """The next step starts now (after the profile's own work at the step edge)."""
        self._open_start = clock.now_ns()

    def action(self, step: int, action: ProfilerAction) -> ProfilerAction:
        """The schedule's ``action`` for ``step``, or the armed window's while one runs."""
        armed = self._armed
        if armed is None:
            return action
        return self._armed_action(armed, step, action)

    def _new_median(self) -> None:
        self._until_median = MEDIAN_EVERY
        ordered = sorted(self._durations)
        median = ordered[len(ordered) // 2]  # the upper median: one sort, no float
        self._median_ns = median
        self._threshold_ns = max(
            int(self.options.slow_factor * median), int(self.options.slow_min_s * 1e9)
        )

    def _slow(self, step: int, duration: int) -> None:
        if self._writing:  # a dump being built competes for the GIL: likely its own doing
            with self._lock:
                self.suppressed["slow_step"] = self.suppressed.get("slow_step", 0) + 1
            return
        median = self._median_ns or 1
        detail = (
            f"step {step} took {_ms(duration)}, {duration / median:.1f}x the median of "
            f"{_ms(median)} over the last {len(self._durations)} steps"
        )
        snap = self._trigger("slow_step", step, detail, open_step=False, stacks=False)
        if snap is not None and self._watch is not None:
            self._watch.submit(lambda: self._write(snap, settle=True))

    # -- windows of the profile -----------------------------------------------------------------
    def window_starts(self, samples: bool) -> None:
        """A window of the profile starts recording: its collectors take the annotations (and
        the sampler, when ``samples``)."""
        self._in_window = True
        self._stop_annotations()
        if samples:
            self._stop_sampler()

    def window_stopped(self) -> None:
        """The window's collectors stopped: the recorder takes over again."""
        self._in_window = False
        if self._running:
            self._record_annotations()
            self._start_sampler()

    def _armed_action(self, armed: _Armed, step: int, action: ProfilerAction) -> ProfilerAction:
        if armed.first is None:
            if action is not ProfilerAction.NONE or self._in_window:
                self._armed = None  # the program's own schedule records now
                return action
            armed.first, self._window_armed = step, armed
            if self._profile is not None:
                window = {"reason": armed.reason, "trigger_step": armed.step}
                self._profile.add_metadata_json("stepscope_flight_window", json.dumps(window))
            return ProfilerAction.WARMUP
        last = armed.first + self.options.window_steps
        if step < last:
            return ProfilerAction.RECORD
        if step == last:
            return ProfilerAction.RECORD_AND_SAVE
        self._armed = None
        return action

    def window_ready(self, prof: profile) -> bool:
        """Write the window a trigger armed (True), or leave the window to the profile."""
        armed, self._window_armed = self._window_armed, None
        if armed is None:
            return False
        self._armed = None
        from stepscope.profiler.handlers import trace_handler

        worker = f"{default_worker_name()}.flight-window-{armed.reason}-step{armed.step}"
        path = trace_handler(self._out, worker_name=worker, use_gzip=self.options.gzip)(prof)
        if path is not None:
            self.dumps.append(path)
            self._say(f"window after {armed.reason} at step {armed.step}: {path}")
        return True

    # -- triggers -------------------------------------------------------------------------------
    def program_raised(self, exc: BaseException) -> None:
        """The program raised out of the profiled code: dump the ring and the open step."""
        if not self._running or self._raised or os.getpid() != self._pid:
            return
        if isinstance(exc, GeneratorExit) or (
            isinstance(exc, SystemExit) and exc.code in (0, None)
        ):
            return
        self._raised = True
        try:
            self._stop_sampler()  # drained to the last sample
            lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
            detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:300] if str(exc) else ""
            snap = self._trigger("exception", self._open_step, detail or type(exc).__name__,
                                 open_step=True, stacks=False)  # fmt: skip
            if snap is not None:
                snap.facts["traceback"] = "".join(lines)[-20_000:]
                self._write(snap, settle=False)
        except Exception as failure:
            self._failed("dump_error", "the exception dump", failure)

    def dump_now(self, reason: str = "attach") -> str:
        """Write a dump now (``stepscope attach PID --dump``); ``FlightError`` says why not."""
        if not self._running:
            raise FlightError("the flight recorder has stopped")
        snap = self._trigger(reason, self._open_step, "asked for by stepscope attach --dump",
                             open_step=True, stacks=True, forced=True)  # fmt: skip
        if snap is None:
            raise FlightError(
                f"no dump: this process has written its {self.options.max_dumps} (max_dumps)"
            )
        path = self._write(snap, settle=True)
        if path is None:
            raise FlightError(f"the dump could not be written into {self._out} (see its stderr)")
        return path

    def _on_signal(self) -> None:
        self._signalled = True  # no lock, no I/O in a signal handler: the thread takes it

    def tick(self) -> None:
        """The recorder's thread, every tick: SIGUSR1 seen, the hang watchdog, the sampler."""
        if not self._running:
            return
        if self._signalled:
            self._signalled = False
            self._dump_from_thread("signal", "SIGUSR1 received")
        hang_ns = int(self.options.hang_s * 1e9)
        last = self._last_end_ns
        if hang_ns and last != self._hang_seen and clock.now_ns() - last > hang_ns:
            self._hang_seen = last
            step = self._open_step
            self._dump_from_thread(
                "hang", f"no step ended for {self.options.hang_s:g} s (step {step} running)"
            )
        if self._restart_sampler:
            self._restart_sampler = False
            self._sampler_restarts += 1
            self._stop_sampler()
            self._start_sampler()

    def _dump_from_thread(self, reason: str, detail: str) -> None:
        snap = self._trigger(reason, self._open_step, detail, open_step=True, stacks=True)
        if snap is not None:
            self._write(snap, settle=True)

    def _trigger(
        self,
        reason: str,
        step: int,
        detail: str,
        *,
        open_step: bool,
        stacks: bool,
        forced: bool = False,
    ) -> Snapshot | None:
        """A snapshot of the ring now, or None when the rate limit suppresses it (counted)."""
        with self._lock:
            automatic = reason in ("slow_step", "hang", "signal")
            last = self._last_auto.get(reason)
            too_soon = automatic and last is not None and step - last < self.options.spacing
            too_many = reason != "exception" and self._started_dumps >= self.options.max_dumps
            if too_many or (too_soon and not forced):
                self.suppressed[reason] = self.suppressed.get(reason, 0) + 1
                return None
            self._started_dumps += 1
            if automatic:
                self._last_auto[reason] = step
        now = clock.now_ns()
        rows = list(self._rows)  # one copy, in C: the loop may append meanwhile
        opened = None
        if open_step:
            rows = rows[max(0, len(rows) - self.options.steps) :]  # N before the open step
            opened = (self._open_step, self._open_start, self._loop_tid)
        snap = Snapshot(reason, detail, step, now, rows, opened,
                        thread_stacks() if stacks else None, self._facts())  # fmt: skip
        if open_step:
            snap.open_spans = list(self._sink)  # the open step's spans so far
        with self._lock:
            self._pending_floors.append(snap.first_ns)
        if self.options.window_steps and reason != "exception" and self._armed is None:
            self._armed = _Armed(reason, step)
        return snap

    def _facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "ring_steps": self.options.steps,
            "median_step_ns": self._median_ns,
            "slow_threshold_ns": None if self._threshold_ns == sys.maxsize else self._threshold_ns,
            "slow_factor": self.options.slow_factor,
            "hang_s": self.options.hang_s,
            "suppressed": dict(self.suppressed),
            "dumps_before": len(self.dumps),
            "spans_dropped": self._spans_dropped,
            "samples_forgotten_early": self._samples_forgotten,
            "sampler_restarts": self._sampler_restarts,
            "sampling_rate_hz": self.options.sampling_rate_hz,
        }
        if self._sampler is not None and self._sampler.mode:
            facts["sampler_mode"] = self._sampler.mode
        if self.notes:
            facts["notes"] = dict(self.notes)
        if self.options.extra:
            facts["extra"] = dict(self.options.extra)
        return facts

    # -- writing (the thread that took the snapshot, or the recorder's) ------------------------
    def _write(self, snap: Snapshot, *, settle: bool) -> str | None:
        try:
            with self._write_lock:
                if settle and self._sampler is not None:
                    time.sleep(DRAIN_S * 1.5)  # the trigger's last samples drained
                self._writing += 1
                try:
                    trace = build_dump(snap, self._samples(), len(self.dumps), self._meta())
                    stamp = clock.to_unix_ns(clock.now_ns())
                    name = (
                        f"{default_worker_name()}.flight-{snap.reason}-step{snap.step}.{stamp}"
                        f".pt.trace.json{'.gz' if self.options.gzip else ''}"
                    )
                    make_directory(self._out, "flight_recorder", "flight recorder directory")
                    path = write_chrome_trace(trace, self._out / name).path
                finally:
                    self._writing -= 1
        except Exception as exc:
            self._failed("dump_error", str(self._out), exc, then="this dump is lost")
            return None
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._pending_floors.remove(snap.first_ns)
        self.dumps.append(path)
        self._say(f"{snap.reason}: {snap.detail}: {path}")
        return path

    def _meta(self) -> dict[str, Any]:
        """The profile's step times (every step, as each window states them)."""
        prof = self._profile
        return {} if prof is None else {"stepscope_overhead": prof.step_times.summary()}

    def _samples(self) -> list[SamplerData]:
        found = list(self._old_samples)
        sampler = self._sampler
        if sampler is not None:
            found.append(sampler.recorded())
        return found

    def _say(self, text: str) -> None:
        stream = sys.stderr
        if stream is not None:
            with contextlib.suppress(Exception):
                print(f"stepscope: flight recorder: {text}", file=stream, flush=True)

    def _failed(self, kind: str, where: str, exc: Exception, then: str = "") -> None:
        _failures.report(kind, where, exc, strict=self.strict,
                         then=then or "the flight recorder goes on")  # fmt: skip

    # -- annotations and samples ----------------------------------------------------------------
    def _record_annotations(self) -> None:
        if self._annotating:
            return
        try:
            default_backend.start(self._sink, self.options.max_spans)
        except RuntimeError as exc:  # another recorder holds the annotations
            self.notes["annotations"] = f"no annotations in the ring: {exc}"
            return
        self._annotating = True

    def _stop_annotations(self) -> None:
        if self._annotating:
            self._annotating = False
            _, dropped = default_backend.stop()
            self._spans_dropped += dropped

    def _start_sampler(self) -> None:
        rate = self.options.sampling_rate_hz
        if not rate or self._sampler is not None or not self._running:
            return
        sampler = Sampler(
            rate,
            max_samples=self.options.max_samples,
            adjust_switch_interval=False,  # the program's switch interval is its own
            drain_interval_s=DRAIN_S,
            on_drain=self._trim,
        )
        try:
            sampler.start()
        except Exception as exc:
            self._failed("sampler_error", "starting the sampler", exc,
                         then="the ring keeps no samples")  # fmt: skip
            return
        self._sampler = sampler

    def _stop_sampler(self) -> None:
        with self._lock:  # the loop's thread (a window) and the recorder's (a restart) may race
            sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        try:
            data = sampler.stop(5.0)
        except Exception as exc:
            self._failed("sampler_error", "stopping the sampler", exc)
            return
        self._sampler_info = sampler.describe(data)
        first = self._rows[0][1] if self._rows else 0
        with self._lock:  # a dump still to be written needs its samples
            first = min(first, *self._pending_floors) if self._pending_floors else first
        kept = [old for old in self._old_samples if old.sample_ts and old.sample_ts[-1] >= first]
        self._old_samples = [*kept, data]

    def _trim(self, backend: Any) -> None:
        """On the sampler's thread: forget samples older than the ring (and pending dumps)."""
        now = clock.now_ns()
        if now < self._trim_at:
            return
        self._trim_at = now + TRIM_EVERY_NS
        rows = self._rows
        if not rows:
            return
        cutoff = rows[0][1]
        with self._lock:
            if self._pending_floors:
                cutoff = min(cutoff, *self._pending_floors)
        early = backend.count() > 0.75 * self.options.max_samples
        if early:  # bounded first: the older half of what is held goes
            cutoff = max(cutoff, (max(self._sample_floor, 0) + now) // 2)
        dropped = backend.forget_before(cutoff)
        if early:
            self._samples_forgotten += dropped
        self._sample_floor = max(self._sample_floor, cutoff)
        if backend.interned()[2] > MAX_STACK_NODES:
            self._restart_sampler = True

    # -- what the listener asks of a session ---------------------------------------------------
    @property
    def current_step(self) -> int:
        """The step the program is in."""
        return self._open_step

    def submit(self, request: object) -> str:
        """A window request: refused (this listener serves ``--dump`` only)."""
        return (
            "this process runs a flight recorder without on-demand windows: "
            "'stepscope attach PID --dump' writes its ring"
        )

    def cancel(self, request: object) -> bool:
        """Nothing to withdraw."""
        return False


def flight_of(value: object, strict: bool | None) -> Flight | None:
    """The recorder for ``profile(flight_recorder=value)``: N steps, a ``FlightRecorder`` or
    None."""
    options = flight_recorder_of(value)
    return None if options is None else Flight(options, strict=strict)


_active: Flight | None = None


def active_flight() -> Flight | None:
    """The flight recorder running in this process, if any."""
    return _active


def _forget_in_child() -> None:
    global _active
    flight, _active = _active, None
    if flight is not None:
        flight.after_fork_in_child()


after_fork_in_child(_forget_in_child)
