"""The flight recorder's own thread (the hang watchdog, the writer of handed-over dumps) and its
SIGUSR1 trigger, chained with the program's handler.

The thread wakes every ``tick_s`` (or when a dump is handed over), writes what was handed over,
then calls the recorder's ``tick`` (a SIGUSR1 seen since, no step ended for too long).  The
signal handler only sets a flag: a Python handler runs on the main thread between two
bytecodes, possibly inside the recorder's own step hook, so it takes no lock and writes
nothing; the thread picks the flag up within a tick.  The program's own SIGUSR1 handler (as
found when the recorder starts) is called after ours; a handler the program installs later
replaces ours (Python keeps one per signal), and at stop ours is taken out only if it is still
the one installed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import deque
from collections.abc import Callable
from types import FrameType
from typing import Any

from stepscope.failures import failure_log
from stepscope.trace.names import hide_thread

__all__ = ["SignalTrigger", "Watch"]

_failures = failure_log("flight")
THREAD_NAME = "stepscope-flight"


class Watch:
    """A daemon thread that runs handed-over jobs and calls ``tick`` every ``tick_s``."""

    def __init__(self, tick: Callable[[], None], tick_s: float) -> None:
        self._tick = tick
        self.tick_s = tick_s
        self._jobs: deque[Callable[[], object]] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(self, job: Callable[[], object]) -> None:
        """Run ``job`` on the thread soon (never from a signal handler: this takes a lock)."""
        self._jobs.append(job)
        self._wake.set()

    def stop(self, timeout_s: float) -> bool:
        """Run the jobs handed over, then end; False when the thread is still busy after
        ``timeout_s`` (it is a daemon: it does not hold the interpreter's exit)."""
        self._stopping = True
        self._wake.set()
        if self._thread.ident is None or self._thread is threading.current_thread():
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        hide_thread(threading.get_native_id())  # never in the program's samples
        while True:
            self._wake.wait(self.tick_s)
            self._wake.clear()
            while self._jobs:
                self._guarded(self._jobs.popleft())
            if self._stopping:
                return
            self._guarded(self._tick)

    @staticmethod
    def _guarded(job: Callable[[], object]) -> None:
        try:
            job()
        except Exception as exc:  # the recorder's failure never reaches the program
            _failures.report("flight_error", "the flight recorder's thread", exc,
                             then="the recorder goes on")  # fmt: skip


class SignalTrigger:
    """Our SIGUSR1 handler in front of the program's (see the module doc)."""

    def __init__(self, on_signal: Callable[[], None]) -> None:
        self._on_signal: Callable[[], None] | None = on_signal
        self._previous: Any = None
        self._installed = False
        self._pid = os.getpid()

    def install(self) -> str:
        """Install the handler; '' when installed, else why not (in words)."""
        if threading.current_thread() is not threading.main_thread():
            return "the profile started off the main thread (Python sets handlers only there)"
        previous = signal.getsignal(signal.SIGUSR1)
        if previous is None:
            return "SIGUSR1 has a handler installed outside Python, which is left alone"
        self._previous = previous
        signal.signal(signal.SIGUSR1, self._handle)
        self._installed = True
        return ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        on_signal = self._on_signal
        if on_signal is not None and os.getpid() == self._pid:
            with contextlib.suppress(Exception):
                on_signal()
        previous = self._previous
        if callable(previous):
            previous(signum, frame)

    def remove(self) -> None:
        """Put the program's handler back if ours is still the one installed; otherwise (off
        the main thread, or replaced since) ours stays in the chain, inert."""
        self._on_signal = None
        if not self._installed:
            return
        self._installed = False
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(signal.SIGUSR1) == self._handle:
                    signal.signal(signal.SIGUSR1, self._previous)
