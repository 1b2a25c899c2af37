"""The in-process stack sampler: the C ``StackSampler`` (or its twin) and the
``ProfilerActivity.SAMPLING`` collector built on it.

Two modes.  ``signal`` (the default where it works: the C extension on Linux, Python 3.11+, and
SIGPROF not used by the program): a C timing thread sends SIGPROF to each busy thread and the C
handler records the stack the thread is executing, so samples land where time is spent; this
module's thread only drains the recorded samples every ``DRAIN_INTERVAL_S`` (see
``_csrc/sampler_signal.c``).  ``thread`` (the twin, and the fallback): the timing thread
itself takes the samples.  Then samples can only be taken where the sampled thread hands over
the GIL, which biases attribution towards code that hands it over often.

In thread mode the timing thread sleeps exponentially distributed intervals (mean
``1 / rate_hz``) on an absolute schedule, so sample times are a Poisson process that cannot lock
step with periodic work in the program; each tick takes one sample of every wanted thread.  A
sample needs the GIL, which a busy thread only hands over after ``sys.getswitchinterval()``
(5 ms by default); to keep the rate at high frequencies the sampler lowers the switch interval
to half a mean period while it runs (only when that is lower than the current value) and
restores it afterwards.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import CodeType
from typing import Any, Protocol, cast

from stepscope import clock
from stepscope._ext import IMPLEMENTATIONS, native, resolve
from stepscope.collectors.base import Collector, WindowContext
from stepscope.collectors.sampler_twin import PyStackSampler
from stepscope.trace.model import TraceBuilder
from stepscope.trace.names import (
    OWN_WORK_FRAME,
    STEPSCOPE_ROOT,
    hidden_threads,
    is_helper,
    is_hidden,
)

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_SAMPLES",
    "DEFAULT_RATE_HZ",
    "IDLE_CPU_SHARE",
    "TRUNCATED_FRAME",
    "Sampler",
    "SamplerCollector",
    "SamplerData",
    "add_samples",
    "make_backend",
]

log = logging.getLogger("stepscope")

DEFAULT_RATE_HZ = 100.0
DEFAULT_MAX_SAMPLES = 1_000_000
DEFAULT_MAX_DEPTH = 127
IDLE_CPU_SHARE = 0.2
"""A thread that used less than this share of one CPU since its previous sample is idle."""
IDLE_WINDOW_NS = 1_000_000
"""Readings of a thread's CPU clock closer than this keep the previous idle verdict."""
TRUNCATED_FRAME = "[truncated]"
SAMPLER_THREAD_NAME = "stepscope-sampler"
BACKENDS = IMPLEMENTATIONS
"""The values of ``implementation=`` (None means ``auto``)."""
MODES = ("signal", "thread")
DRAIN_INTERVAL_S = 0.01
"""Signal mode: how often recorded samples are moved out of the handler's rings."""


class _Backend(Protocol):
    def sample(self) -> int: ...
    def count(self) -> int: ...
    def export(self) -> Mapping[str, Any]: ...
    def forget_before(self, ts_ns: int, /) -> int: ...
    def interned(self) -> tuple[int, int, int]: ...


class _SignalBackend(_Backend, Protocol):
    def start_signals(self, rate_hz: float, seed: int = 0, /) -> None: ...
    def drain(self) -> int: ...
    def stop_signals(self, timeout_s: float = 1.0, /) -> Mapping[str, Any]: ...


def make_backend(
    kind: str | None,
    max_samples: int,
    max_depth: int,
    thread_ids: Iterable[int] | None,
) -> tuple[str, _Backend]:
    """A sampler object: ``native`` (C), ``python`` (the twin), or ``auto`` (None: the same) for
    C when built (see :func:`stepscope._ext.resolve`)."""
    mod = resolve(kind, what="sampler implementation (backend)")
    ids = None if thread_ids is None else [int(t) for t in thread_ids]
    if mod is not None:
        if sys.version_info < (3, 11) and ids is not None:
            # Before 3.11 the C sampler knows threads by ident (no native id in PyThreadState).
            idents = {t.native_id: t.ident for t in threading.enumerate() if t.native_id}
            ids = [idents.get(tid) or tid for tid in ids]
        return "native", mod.StackSampler(
            max_samples, max_depth, ids, IDLE_CPU_SHARE, IDLE_WINDOW_NS
        )
    return "python", PyStackSampler(max_samples, max_depth, ids, IDLE_CPU_SHARE, IDLE_WINDOW_NS)


@dataclass(frozen=True)
class SamplerData:
    """Everything one sampling run recorded (the backends' export, decoded into arrays)."""

    codes: list[CodeType | None]
    frame_code: array[int]
    frame_line: array[int]
    stack_parent: array[int]
    stack_frame: array[int]
    sample_tid: array[int]
    sample_ts: array[int]
    sample_stack: array[int]
    sample_idle: array[int]
    dropped: int
    ticks: int
    busy_ns: int

    @classmethod
    def from_export(cls, raw: Mapping[str, Any]) -> SamplerData:
        """Decode a backend's ``export()``."""

        def column(key: str, code: str) -> array[int]:
            values = array(code)
            values.frombytes(raw[key])
            return values

        tids = column("sample_tid", "q")
        if not raw["native_tids"]:  # Python 3.10: thread idents, mapped while the threads live
            idents = {t.ident: t.native_id for t in threading.enumerate() if t.native_id}
            tids = array("q", (idents.get(t, t) for t in tids))
        return cls(
            codes=list(raw["codes"]),
            frame_code=column("frame_code", "i"),
            frame_line=column("frame_line", "i"),
            stack_parent=column("stack_parent", "i"),
            stack_frame=column("stack_frame", "i"),
            sample_tid=tids,
            sample_ts=column("sample_ts", "q"),
            sample_stack=column("sample_stack", "i"),
            sample_idle=column("sample_idle", "B"),
            dropped=int(raw["dropped"]),
            ticks=int(raw["ticks"]),
            busy_ns=int(raw["busy_ns"]),
        )

    def __len__(self) -> int:
        return len(self.sample_ts)

    def stack_names(self, stack_id: int) -> tuple[tuple[str, str, int], ...]:
        """(name, file, line) of each frame of a stack, root first."""
        names: list[tuple[str, str, int]] = []
        while stack_id >= 0:
            fid = self.stack_frame[stack_id]
            names.append((*code_label(self.codes[self.frame_code[fid]]), self.frame_line[fid]))
            stack_id = self.stack_parent[stack_id]
        names.reverse()
        return tuple(names)


def code_label(code: CodeType | None) -> tuple[str, str]:
    """(function name, file) of a code object; the truncation marker for None."""
    if code is None:
        return TRUNCATED_FRAME, ""
    return getattr(code, "co_qualname", code.co_name), code.co_filename


def add_samples(
    builder: TraceBuilder,
    data: SamplerData,
    pid: int,
    *,
    keep_own_frames: bool = False,
    own_threads: frozenset[int] | None = None,
) -> int:
    """Append a run's frames, stacks and samples to ``builder``; returns the sample count.

    Frames of stepscope itself and of the program's launcher are left out of the stacks unless
    ``keep_own_frames`` (the function profiler cuts its stacks at its own frame).  A sample
    taken in stepscope's own code ends in one ``OWN_WORK_FRAME`` below the program's frames
    that called it, also when stepscope's frame had called into the standard library or torch's
    profiler (``trace.names.is_helper``: its sampler's start waiting in ``Condition.wait``):
    a profiler's own work is never the program's time.  ``own_threads``: stepscope's own
    threads whose samples are left out (default: those running now)."""
    labels = [code_label(code) for code in data.codes]
    hidden = [not keep_own_frames and is_hidden(file) for _, file in labels]  # once per code
    own = [h and f.startswith(STEPSCOPE_ROOT) for h, (_, f) in zip(hidden, labels, strict=True)]
    helper = [not keep_own_frames and is_helper(file) for _, file in labels]
    frames = [
        -1 if hidden[code] else builder.frame(labels[code][0], labels[code][1], line)
        for code, line in zip(data.frame_code, data.frame_line, strict=True)
    ]
    own_frame = [own[code] for code in data.frame_code]
    helper_frame = [helper[code] for code in data.frame_code]
    module_frame = [labels[code][0] == "<module>" for code in data.frame_code]
    own_work = -1
    parents, frame_of = data.stack_parent, data.stack_frame
    stacks: dict[int, int] = {-1: -1}
    if keep_own_frames:
        own_threads = frozenset()
    elif own_threads is None:
        own_threads = hidden_threads()
    kept = 0
    for tid, ts, stack, idle in zip(
        data.sample_tid, data.sample_ts, data.sample_stack, data.sample_idle, strict=True
    ):
        if tid in own_threads:
            continue  # one of stepscope's own threads (the memory watcher)
        kept += 1
        sid = stacks.get(stack)
        if sid is None:
            path: list[int] = []
            helpers_only = True  # path holds only helper frames (and the own-work frame)
            node = stack
            while node >= 0:
                f = frame_of[node]
                frame = frames[f]
                parent = parents[node]
                if frame >= 0:
                    path.append(frame)
                    # a module body run by stepscope (`stepscope run -m json.tool`) is the
                    # program, whatever its file
                    top = module_frame[f] and parent >= 0 and own_frame[frame_of[parent]]
                    helpers_only = helpers_only and helper_frame[f] and not top
                elif own_frame[f]:
                    if helpers_only:
                        # stepscope's own work (a step hook, a snapshot, its threads' start):
                        # one frame that says so, not self time of the user's frame that called it
                        if own_work < 0:
                            own_work = builder.frame(OWN_WORK_FRAME, "", 0)
                        path = [own_work]
                else:
                    helpers_only = False  # a launcher (runpy): what it runs is the program
                node = parent
            path.reverse()
            sid = stacks[stack] = builder.stack(path)
        builder.sample(pid, tid, ts, sid, 1, bool(idle))
    return kept


class Sampler:
    """Samples the stacks of Python threads at ``sampling_rate_hz`` on a background thread."""

    def __init__(
        self,
        sampling_rate_hz: float | None = None,
        *,
        thread_ids: Iterable[int] | None = None,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_duration_s: float | None = None,
        implementation: str | None = None,
        mode: str | None = None,
        adjust_switch_interval: bool = True,
        seed: int | None = None,
        drain_interval_s: float = DRAIN_INTERVAL_S,
        on_drain: Callable[[_Backend], None] | None = None,
    ) -> None:
        """``mode``: ``signal``, ``thread`` or None (signal where it works); see the module.
        ``implementation``: ``auto`` (default), ``native`` or ``python``.  ``on_drain`` is
        called on the sampler's thread with the backend after each drain (signal mode) or
        sample (thread mode): the flight recorder trims its ring there, where no drain runs
        at the same time."""
        rate_hz = DEFAULT_RATE_HZ if sampling_rate_hz is None else sampling_rate_hz
        implementation = "auto" if implementation is None else implementation
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"sampler implementation must be one of {', '.join(IMPLEMENTATIONS)}, "
                f"got {implementation!r}"
            )
        if mode not in (None, *MODES):
            raise ValueError(f"sampler mode must be one of {MODES} or None, got {mode!r}")
        if isinstance(rate_hz, bool) or not isinstance(rate_hz, (int, float)) or not rate_hz > 0:
            raise ValueError(
                f"rate_hz must be a positive number of samples per second, got {rate_hz!r}"
            )
        if rate_hz > 100_000:
            raise ValueError(
                f"sampling_rate_hz={rate_hz} is above the supported 100000 samples per second"
            )
        if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 0:
            raise ValueError(f"max_samples must be a non-negative int, got {max_samples!r}")
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth must be a positive int, got {max_depth!r}")
        if not drain_interval_s > 0:
            raise ValueError(f"drain_interval_s must be positive, got {drain_interval_s!r}")
        if max_duration_s is not None and not max_duration_s > 0:
            raise ValueError(f"max_duration_s must be positive or None, got {max_duration_s!r}")
        self.rate_hz = float(rate_hz)
        self.thread_ids = None if thread_ids is None else tuple(int(t) for t in thread_ids)
        self.max_samples = max_samples
        self.max_depth = max_depth
        self.max_duration_s = max_duration_s
        self.implementation = implementation
        self.requested_mode = mode
        self.mode = ""
        """``signal`` or ``thread`` once running (see ``wait_running``)."""
        self.mode_reason: str | None = None
        """Why signal mode is not used, when it was wanted (None when asked for ``thread``)."""
        self.signal_stats: dict[str, Any] = {}
        self.adjust_switch_interval = adjust_switch_interval
        self.seed = seed
        self.drain_interval_s = drain_interval_s
        self.on_drain = on_drain
        self.backend_name = ""
        self.truncated = False
        """True when sampling stopped at ``max_duration_s`` before ``stop()``."""
        self.errors = 0
        self.error: str | None = None
        self.started_ns = 0
        self.stopped_ns = 0
        self._backend: _Backend | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._running = threading.Event()
        self._switch: tuple[float, float] | None = None

    @property
    def running(self) -> bool:
        """Whether the timing thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start sampling (returns once the timing thread runs)."""
        if self._thread is not None:
            raise RuntimeError("this Sampler was already started; create a new one per run")
        self.backend_name, self._backend = make_backend(
            self.implementation, self.max_samples, self.max_depth, self.thread_ids
        )
        self.started_ns = clock.now_ns()
        self._thread = threading.Thread(target=self._run, name=SAMPLER_THREAD_NAME, daemon=True)
        self._thread.start()

    def wait_running(self, timeout: float | None) -> bool:
        """Wait until the timing thread is sampling (and ``mode`` is known); False on timeout."""
        return self._running.wait(timeout)

    def _start_signals(self) -> bool:
        """Signal mode if wanted and possible; otherwise the reason is kept in ``mode_reason``."""
        if self.requested_mode == "thread":
            return False
        backend = self._backend
        if not hasattr(backend, "start_signals"):
            self.mode_reason = "the pure-Python twin samples from a timing thread"
            return False
        try:
            cast(_SignalBackend, backend).start_signals(self.rate_hz, self.seed or 0)
        except (RuntimeError, ValueError) as exc:
            self.mode_reason = str(exc)
            if self.requested_mode == "signal":
                log.warning("stepscope: signal sampling unavailable (%s); using a thread", exc)
            return False
        return True

    def _run(self) -> None:
        if self._start_signals():
            self.mode = "signal"
            self._run_signals()
        else:
            self.mode = "thread"
            self._lower_switch_interval()
            self._run_thread()

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self.error = f"{type(exc).__name__}: {exc}"
        log.warning("stepscope: the stack sampler failed (%s); sampling stopped", self.error)

    def _run_signals(self) -> None:
        backend = cast(_SignalBackend, self._backend)
        deadline = self.started_ns + int(self.max_duration_s * 1e9) if self.max_duration_s else None
        self._running.set()
        try:
            while not self._stop.wait(self.drain_interval_s):
                if deadline is not None and clock.now_ns() >= deadline:
                    self.truncated = True
                    return
                backend.drain()
                if self.on_drain is not None:
                    self.on_drain(backend)
        except Exception as exc:  # never let the sampler break the program
            self._failed(exc)
        finally:
            try:
                self.signal_stats = dict(backend.stop_signals(1.0))
            except Exception as exc:
                self._failed(exc)

    def _run_thread(self) -> None:
        backend = self._backend
        assert backend is not None
        rng = random.Random(self.seed)
        mean_ns = 1e9 / self.rate_hz
        deadline = self.started_ns + int(self.max_duration_s * 1e9) if self.max_duration_s else None
        now_ns, stop, expo = clock.now_ns, self._stop, rng.expovariate
        # The GIL arrives late (up to a switch interval); draw shorter intervals by the running
        # mean lateness so that the achieved rate stays close to rate_hz.
        late_ns = 0.0
        next_ns = now_ns() + int(expo(1.0) * mean_ns)
        self._running.set()
        while True:
            wait_ns = next_ns - now_ns()
            if (wait_ns > 0 and stop.wait(wait_ns / 1e9)) or stop.is_set():
                return
            now = now_ns()
            if deadline is not None and now >= deadline:
                self.truncated = True
                return
            try:
                backend.sample()
                if self.on_drain is not None:
                    self.on_drain(backend)
            except Exception as exc:  # never let the sampler break the program
                self._failed(exc)
                return
            late_ns += (now - next_ns - late_ns) * 0.1
            next_ns += int(expo(1.0) * max(mean_ns - late_ns, mean_ns * 0.1))
            if next_ns <= now_ns():
                # Still behind: restart the memoryless schedule from now rather than sample
                # again at once, before the program could run.
                next_ns = now_ns() + int(expo(1.0) * max(mean_ns - late_ns, mean_ns * 0.1))

    def stop(self, timeout: float | None = None) -> SamplerData:
        """Stop sampling and return what was recorded; TimeoutError if the thread hangs."""
        if self._thread is None or self._backend is None:
            raise RuntimeError("the Sampler was not started")
        self._stop.set()
        self._thread.join(timeout)
        self.stopped_ns = clock.now_ns()
        self._restore_switch_interval()
        if self._thread.is_alive():
            raise TimeoutError(f"the sampler thread did not stop within {timeout} s")
        return SamplerData.from_export(self._backend.export())

    def recorded(self) -> SamplerData:
        """What was recorded so far, while it runs (signal mode: up to the last drain)."""
        if self._backend is None:
            raise RuntimeError("the Sampler was not started")
        return SamplerData.from_export(self._backend.export())

    def _lower_switch_interval(self) -> None:
        current = sys.getswitchinterval()
        wanted = 0.5 / self.rate_hz
        if self.adjust_switch_interval and wanted < current:
            sys.setswitchinterval(wanted)
            self._switch = (current, sys.getswitchinterval())

    def _restore_switch_interval(self) -> None:
        if self._switch is not None:
            previous, ours = self._switch
            self._switch = None
            if sys.getswitchinterval() == ours:  # untouched by anyone else meanwhile
                sys.setswitchinterval(previous)

    def forget_in_child(self) -> None:
        """In a forked child: the timing thread stayed in the parent; undo what it set here."""
        self._thread = None
        self._restore_switch_interval()
        mod = native()
        if mod is not None and hasattr(mod, "_sampler_after_fork_in_child"):
            mod._sampler_after_fork_in_child()

    def describe(self, data: SamplerData) -> dict[str, Any]:
        """Settings and counters of a finished run, for trace metadata."""
        duration_s = max(self.stopped_ns - self.started_ns, 1) / 1e9
        info: dict[str, Any] = {
            "backend": self.backend_name,
            "mode": self.mode,
            "rate_hz": self.rate_hz,
            "ticks": data.ticks,
            "effective_rate_hz": round(data.ticks / duration_s, 1),
            "samples": len(data),
            "dropped": data.dropped,
            "max_samples": self.max_samples,
            "max_depth": self.max_depth,
            "busy_ms": round(data.busy_ns / 1e6, 3),
            "idle_cpu_share": IDLE_CPU_SHARE,
        }
        if self.mode_reason and self.requested_mode != "thread":
            info["mode_reason"] = self.mode_reason
        if self.signal_stats:
            stats = self.signal_stats
            info["signals"] = stats["signals"]
            info["late_signals"] = stats["late"]
            info["lost_ring_full"] = stats["ring_full"]
            info["handler_ms"] = round(stats["handler_ns"] / 1e6, 3)
            if stats.get("threads_without_slot"):  # beyond the engine's 256 thread slots
                info["lost_threads_without_slot"] = stats["threads_without_slot"]
            if stats.get("invalid_codes"):  # code freed while a drain ran, or not a code object
                info["lost_invalid_frames"] = stats["invalid_codes"]
            if stats["replaced"]:
                info["sigprof_replaced_during_run"] = True
            elif not stats["restored"]:
                info["sigprof_left_installed"] = True
        if self.truncated:
            info["stopped_at_max_duration_s"] = self.max_duration_s
        if self.errors:
            info["error"] = self.error
        return info


class SamplerCollector(Collector):
    """Statistical stacks of every (or chosen) thread, as the window's samples table."""

    name = "sampler"
    collects_off_loop = True

    def __init__(
        self,
        sampling_rate_hz: float | None = None,
        *,
        thread_ids: Iterable[int] | None = None,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        max_depth: int = DEFAULT_MAX_DEPTH,
        implementation: str | None = None,
        mode: str | None = None,
        stop_timeout_s: float = 10.0,
    ) -> None:
        rate_hz = DEFAULT_RATE_HZ if sampling_rate_hz is None else sampling_rate_hz
        self._options: dict[str, Any] = {
            "thread_ids": None if thread_ids is None else tuple(thread_ids),
            "max_samples": max_samples,
            "max_depth": max_depth,
            "implementation": "auto" if implementation is None else implementation,
            "mode": mode,
        }
        Sampler(rate_hz, **self._options)  # validate the options now, not at the first window
        self.rate_hz = rate_hz
        self.stop_timeout_s = stop_timeout_s
        self._sampler: Sampler | None = None

    def start(self, ctx: WindowContext) -> None:
        """Start the timing thread."""
        self._sampler = Sampler(self.rate_hz, **self._options)
        self._sampler.start()

    def stop(self, ctx: WindowContext) -> None:
        """Stop sampling; settings and counters go to the window's metadata."""
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        data = sampler.stop(self.stop_timeout_s)
        # stepscope's own threads as they are now (the memory watcher stops after this)
        ctx.held[id(self)] = (data, hidden_threads())
        ctx.metadata["stepscope_sampler"] = sampler.describe(data)
        if data.dropped:
            ctx.summary.append(
                f"{data.dropped} stack samples dropped (max_samples={sampler.max_samples})"
            )
        if sampler.errors:
            ctx.summary.append(f"stack sampler stopped early: {sampler.error}")

    def collect(self, builder: TraceBuilder, ctx: WindowContext) -> None:
        """Append the window's samples to the trace."""
        held = ctx.held.pop(id(self), None)
        if held is not None:
            data, own_threads = held
            add_samples(builder, data, ctx.pid, own_threads=own_threads)

    def after_fork_in_child(self) -> None:
        """In a child forked during a window: no sampling there, the parent's samples dropped."""
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.forget_in_child()

    def close(self) -> None:
        """Stop a timing thread still running."""
        sampler, self._sampler = self._sampler, None
        if sampler is not None and sampler.running:
            sampler.stop(self.stop_timeout_s)
