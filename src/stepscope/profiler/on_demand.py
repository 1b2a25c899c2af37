"""On-demand windows: a profile whose step source runs all along and whose windows come on request.

``OnDemand`` starts a ``profile`` that records nothing (its schedule answers NONE, only the
always-on annotation collector exists, idle) and a listener thread (``control_listener``)
that sleeps in ``accept``.  A request (``stepscope attach``) is checked and its collectors are
built on the listener's thread; the program's own thread takes it at its next step boundary —
the schedule call, the only place that looks — moves those collectors into the profile and
answers WARMUP, then RECORD for the next N steps, the last one RECORD_AND_SAVE.  The window is
written by ``trace_handler`` into the request's directory and the listener tells the client.
A request for every rank names the first step (``start_step``) so that all ranks record the
same step numbers.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepscope.failures import failure_log
from stepscope.forks import after_fork_in_child
from stepscope.profiler.activity import default_activities
from stepscope.profiler.control_protocol import RecordMessage
from stepscope.profiler.options import RecordingOptions, adopt
from stepscope.profiler.profile import profile
from stepscope.profiler.schedule import ProfilerAction

__all__ = ["LISTEN_ENV", "OnDemand", "WindowRequest", "listen"]

LISTEN_ENV = "STEPSCOPE_LISTEN"
STEP_ON_ENV = "STEPSCOPE_STEP_ON"
EXIT_NOTICE_S = 1.0
"""How long an exiting process waits for its listener to tell a waiting client why."""
_failures = failure_log("listener")


@dataclass
class WindowRequest:
    """One ``attach``: what to record, and where it stands (updated by the program's thread)."""

    steps: int
    options: RecordingOptions
    start_step: int | None = None
    state: str = "pending"
    """pending -> started -> done | failed; or cancelled while pending."""
    first_step: int | None = None
    last_step: int | None = None
    """The last step the written window holds (the one the process ended in, when partial)."""
    files: list[str] = field(default_factory=list)
    complete: bool = True
    reason: str = ""
    built: profile | None = None
    withdrawn: bool = False
    """The client left before the window's warm-up step: the program's thread drops it."""
    told: threading.Event = field(default_factory=threading.Event)
    """Set by the listener's thread once the client has the final answer."""
    wake: tuple[socket.socket, socket.socket] = field(default_factory=socket.socketpair)
    """A byte on ``wake[1]`` tells the listener's thread (reading ``wake[0]``) the state moved."""

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> WindowRequest:
        """A request from the client's message; ``ValueError`` names what is wrong."""
        asked = RecordMessage.from_message(message)
        return cls(asked.steps, asked.options, asked.start_step)

    def move_to(self, state: str, reason: str = "") -> None:
        """Change state and wake the listener's thread serving this request."""
        self.state, self.reason = state, reason or self.reason
        # OSError: the client is gone and the pair closed, or the pair's buffer is full
        with contextlib.suppress(OSError):
            self.wake[1].send(b"!", socket.MSG_DONTWAIT)

    def close(self) -> None:
        """Close the wake-up pair."""
        for end in self.wake:
            end.close()

    def describe(self) -> str:
        """Its steps and directory, in words."""
        first = "the next" if self.first_step is None else f"from step {self.first_step},"
        return f"{first} {self.steps} step(s) into {self.options.out}"


def _default_activities() -> list[str]:
    """The CPU (and torch's device, CUDA on a GPU machine) in a torch program, else CPU and
    sampled stacks."""
    if "torch" not in sys.modules:
        return ["CPU", "SAMPLING"]
    return sorted(a.name for a in default_activities())


class OnDemand:
    """A running profile with no window until a ``WindowRequest`` arrives (see module doc)."""

    def __init__(
        self, step_on: str | Callable[..., Any] | None = None, *, strict: bool | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._pending: WindowRequest | None = None
        self._window: WindowRequest | None = None
        self._saving: WindowRequest | None = None
        self._closed = False
        self.trace_files: list[str] = []
        """Every trace written by this process's windows."""
        self._cut = ""
        """Why the window in progress ends unwritten (the program started its own profile)."""
        self.profile = profile(
            activities=["CPU"],
            torch_ops=False,
            schedule=self,
            on_trace_ready=self._window_ready,
            step_on=step_on,
            strict=strict,
        )
        self.profile.gives_way = True  # the program's own profile always may start
        self.profile.on_pause = self._give_way
        self.listener: Any = None

    # -- the program's thread ------------------------------------------------------------------
    def __call__(self, step: int) -> ProfilerAction:
        """The schedule: NONE between windows; a request is taken at the first boundary after."""
        window = self._window
        if window is None:
            if self._pending is None:
                return ProfilerAction.NONE
            window = self._take(step)
            if window is None:
                return ProfilerAction.NONE
        first = window.first_step
        assert first is not None
        if step < first - 1 or (window.withdrawn and step == first - 1):
            if window.withdrawn:
                self._window = None
                window.move_to("cancelled")
            return ProfilerAction.NONE
        if step == first - 1:
            return ProfilerAction.WARMUP
        last = first + window.steps - 1
        if step < last:
            return self._started(window, ProfilerAction.RECORD)
        if step == last:
            return self._started(window, ProfilerAction.RECORD_AND_SAVE)
        self._window, self._saving = None, window  # written by the transition that follows
        return ProfilerAction.NONE

    def _started(self, window: WindowRequest, action: ProfilerAction) -> ProfilerAction:
        if window.state == "pending":
            window.move_to("started")
        return action

    def _take(self, step: int) -> WindowRequest | None:
        with self._lock:
            request, self._pending = self._pending, None
            if request is None or request.state != "pending":
                return None
            first = step + 1 if request.start_step is None else request.start_step
            if step > first:
                request.move_to(
                    "failed",
                    f"this process was at step {step}, past the agreed first step {first}",
                )
                return None
            request.first_step = first
            self._configure(request)
            self._window = request
            return request

    def _configure(self, request: WindowRequest) -> None:
        prof, built = self.profile, request.built
        assert built is not None
        for collector in prof.collectors:
            prof._guarded(collector, "close", collector.close)
        adopt(prof, built)
        request.built = None
        prof.preset_metadata["stepscope_on_demand"] = {
            "steps": request.steps,
            "first_step": request.first_step,
        }

    def _give_way(self) -> None:
        """The program starts its own profile (``profile.gives_way``): a request waiting fails,
        a window in progress ends unwritten, and requests are refused until that one stops."""
        step = self.profile.step_num
        why = (
            f"the program started its own stepscope profile at step {step}; attach again when "
            "that profile has stopped"
        )
        with self._lock:
            pending, self._pending = self._pending, None
            window = self._window
            if window is not None and window.state == "pending":
                self._window, pending = None, pending or window
            elif window is not None:
                self._cut = f"{why} (this window was cut there, unwritten)"
        if pending is not None:
            pending.move_to("failed", why)

    def _window_ready(self, prof: profile) -> None:
        request, self._saving = self._saving, None
        if request is None:  # the program ended inside a window (profile.stop)
            request, self._window = self._window, None
        if request is None:
            return
        if self._cut:
            cut, self._cut = self._cut, ""
            request.move_to("failed", cut)
            return
        if request.state == "pending":  # it ended in warmup: no step was recorded
            request.move_to("failed", "the process exited before the window started")
            return
        out = request.options.out
        try:
            path = request.options.handler()(prof)
            metadata = prof.trace().metadata
            complete = bool(metadata.get("stepscope_window_complete", True))
            window = metadata.get("stepscope_window")
            end = window.get("last_step") if isinstance(window, dict) else None
        except Exception as exc:  # the window is lost, the program goes on
            request.move_to("failed", f"could not write the trace to {out}: {exc}")
            _failures.report("window_write_error", out, exc, then="the window is lost")
            return
        if path is None:  # trace_handler counted and logged why
            request.move_to("failed", f"could not write the trace to {out}")
            return
        request.files.append(path)
        self.trace_files.append(path)
        if isinstance(end, int) and not isinstance(end, bool) and request.first_step is not None:
            # the step number at the window's end: one past its last step when the window
            # ran whole, else the step the process ended in (cut short, even the last one)
            if end == request.first_step + request.steps:
                request.last_step = end - 1
            else:
                request.last_step, complete = end, False
        request.complete = complete
        request.move_to("done")

    # -- the listener's thread -----------------------------------------------------------------
    def submit(self, request: WindowRequest) -> str:
        """Queue ``request`` for the next step boundary; '' when taken, else why not."""
        try:
            kwargs = request.options.profile_kwargs(_default_activities())
            request.built = profile(**kwargs, strict=self.profile.strict)
        except (ValueError, TypeError) as exc:
            return str(exc)
        with self._lock:
            if self._closed:
                return "the process is exiting"
            if self.profile._paused:
                return (
                    "the program is running its own stepscope profile; attach again when it "
                    "has stopped"
                )
            busy = self._window or self._pending or self._saving
            if busy is not None:
                return f"already recording ({busy.describe()}); attach again when it is written"
            self._pending = request
        return ""

    def cancel(self, request: WindowRequest) -> bool:
        """Withdraw ``request`` unless its warm-up step has begun; returns whether it will be."""
        with self._lock:
            if self._pending is request:
                self._pending = None
            elif self._window is request and request.state == "pending":
                request.withdrawn = True  # the program's thread drops it before its warm-up
                return True
            else:
                return False  # the window goes on
        request.move_to("cancelled")
        return True

    @property
    def step(self) -> Callable[[], None]:
        """The profile's ``step`` (for step sources wired by the caller)."""
        return self.profile.step

    @property
    def current_step(self) -> int:
        """The step the program is in."""
        return self.profile.step_num

    # -- lifetime ------------------------------------------------------------------------------
    def start(self) -> OnDemand:
        """Start the idle profile and the listener."""
        from stepscope.profiler.control_listener import Listener

        self.profile.start()
        self.listener = Listener(self).start()  # never raises: unattachable at worst, said once
        return self

    @property
    def attachable(self) -> bool:
        """Whether the listener listens (its socket: ``listener.path``)."""
        return self.listener is not None and self.listener.path is not None

    def stop(self) -> None:
        """Stop listening; a window in progress is written as it is, a waiting request fails."""
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, None
        if self.listener is not None:
            self.listener.close()
        if pending is not None:
            pending.move_to("failed", "the process exited before the window started")
            pending.told.wait(EXIT_NOTICE_S)  # the listener's thread is a daemon: let it answer
        window = self._window
        self.profile.stop()
        if window is not None:
            window.told.wait(EXIT_NOTICE_S)

    def __enter__(self) -> OnDemand:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_session: OnDemand | None = None
_session_lock = threading.Lock()


def _new_lock_in_child() -> None:
    global _session_lock
    _session_lock = threading.Lock()


after_fork_in_child(_new_lock_in_child)


def listen(step_on: str | Callable[..., Any] | None = "optimizer") -> OnDemand:
    """Make this process attachable (``stepscope attach PID``); stops at interpreter exit.

    ``step_on`` is the step source, as ``profile(step_on=)``: ``"optimizer"`` (torch's
    optimizer steps), ``"module:qualname"`` or a function; None when the program calls
    ``listen().step()`` itself.  Calling it again, from any thread, returns the same session.
    It never fails the program: a directory that cannot be used safely gives way to a private
    one, and when no socket can be made the process runs on unattachable, said once on stderr
    (``session.attachable`` is False).
    """
    global _session
    with _session_lock:
        if _session is None:
            session = OnDemand(step_on).start()
            atexit.register(session.stop)
            _session = session
        return _session


def listen_from_environment() -> OnDemand | None:
    """``listen()`` when ``STEPSCOPE_LISTEN=1`` (step source: ``STEPSCOPE_STEP_ON``)."""
    if os.environ.get(LISTEN_ENV, "").strip() not in ("1", "true", "yes"):
        return None
    if sys.argv and (sys.argv[0] == "-m" or os.path.basename(sys.argv[0]) == "stepscope"):
        return None  # the stepscope command itself (attach, run) is not a program to attach to
    step_on = os.environ.get(STEP_ON_ENV, "").strip() or "optimizer"
    try:
        return listen(None if step_on == "none" else step_on)
    except Exception as exc:
        _failures.report("listen_error", LISTEN_ENV, exc, then="this process cannot be attached to")
        return None
