"""Windows saved off the training loop: each profile's writer thread, its bound, and the exit.

A stopped window whose trace goes to stepscope's own ``trace_handler`` (or to no handler) is
collected, merged, built and written on its profile's writer thread, one window after another,
while the loop goes on.  At most ``max_pending`` windows may be stopped and not yet saved; while
that many wait, the profile records no new window (each one left out is counted).
``profile.stop`` waits for its windows; the interpreter's exit waits for those of a profile that
was never stopped, and so does a SIGTERM that the program leaves to its default action (the
handler is set only while windows are being saved, and the signal is raised again after the
wait, so the exit status is SIGTERM's).  Each wait lasts at most ``config.save_wait_s``, and
every window not saved by then is named on stderr.  Files are written atomically: a window is
either whole on disk or absent.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from types import FrameType

from stepscope.atomic import remove_scratch
from stepscope.config import config
from stepscope.forks import after_fork_in_child
from stepscope.trace.names import hide_thread

__all__ = ["SaveJob", "WindowWriter", "release_sigterm", "wait_for_all"]

log = logging.getLogger("stepscope")
IDLE_S = 30.0
"""A writer thread with nothing to save for this long ends (the next window starts another)."""


class SaveJob:
    """One stopped window to save: ``run`` builds and writes it (on the writer thread)."""

    def __init__(self, label: str, run: Callable[[], None]) -> None:
        self.label = label
        """The window's name, ``window 3 (steps 24-35)``."""
        self.run = run
        self.error: BaseException | None = None
        """What ``run`` raised (a strict failure, re-raised on the loop's thread later)."""
        self.done = threading.Event()


class WindowWriter:
    """One profile's queue of windows to save, and the thread that saves them in order."""

    def __init__(self, max_pending: int) -> None:
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending_windows must be an int of 1 or more, got {max_pending}")
        self.max_pending = max_pending
        self.skipped = 0
        """Windows the profile left out because ``max_pending`` windows were waiting."""
        self._jobs: deque[SaveJob] = deque()  # queued, the first one being saved
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._errors: list[BaseException] = []
        self._waiters = 0

    @property
    def pending(self) -> int:
        """Windows stopped and not saved yet (the one being saved included)."""
        return len(self._jobs)

    def full(self) -> bool:
        """Whether ``max_pending`` windows wait: the next window is not recorded."""
        return len(self._jobs) >= self.max_pending

    def labels(self) -> list[str]:
        """The names of the windows waiting, oldest first."""
        with self._cond:
            return [job.label for job in self._jobs]

    def submit(self, job: SaveJob) -> None:
        """Queue a window (the caller checked ``full`` when the window began)."""
        with self._cond:
            self._jobs.append(job)
            self._closing = False
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="stepscope-writer", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
        _watch(self)

    def wait(self, timeout: float | None) -> list[str]:
        """Wait for the queue to empty; the names of the windows still waiting after it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.waited_for(), self._cond:
            while self._jobs:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            return [job.label for job in self._jobs]

    @contextlib.contextmanager
    def waited_for(self) -> Iterator[None]:
        """Within it, windows saved count as waited for (``waited_on``): the caller will wait
        for them before it goes on (``wait``, or a profile's whole ``stop``)."""
        with self._cond:
            self._waiters += 1
        try:
            yield
        finally:
            with self._cond:
                self._waiters -= 1

    def waited_on(self) -> bool:
        """Whether a thread waits, or is about to wait, for the windows being saved now."""
        return self._waiters > 0

    def raise_error(self) -> None:
        """Raise (on the loop's thread) the first error a save raised since the last call: a
        strict failure off the loop."""
        if not self._errors:  # every step asks: no lock for the usual answer
            return
        with self._cond:
            errors, self._errors = self._errors, []
        if errors:
            raise errors[0]

    def skip(self, label: str) -> None:
        """Count a window left out because ``max_pending`` windows wait (logged once)."""
        self.skipped += 1
        if self.skipped == 1:
            log.warning(
                "stepscope: %s not recorded: %d windows were still being saved "
                "(max_pending_windows=%d); each window left out is counted in the next "
                "trace's metadata (stepscope_windows_skipped)",
                label,
                self.pending,
                self.max_pending,
            )

    def drain(self, why: str) -> list[str]:
        """Wait for the queue to empty (``config.save_wait_s`` at most), then let the thread
        end; each window not saved by then is named on stderr."""
        left = self.wait(config.save_wait_s) if self._jobs else []
        for label in left:
            _say(f"{label} was not written: {why} and its save did not end within "
                 f"{config.save_wait_s:g} s (STEPSCOPE_SAVE_WAIT_S)")  # fmt: skip
        self.close()
        return left

    def close(self) -> None:
        """Let the thread end once the queue is empty (a later ``submit`` starts a new one)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def _serve(self) -> None:
        me = threading.get_native_id()
        hide_thread(me)  # never sampled or traced into the program's windows
        try:
            while True:
                with self._cond:
                    if not self._jobs and not self._closing:
                        self._cond.wait(IDLE_S)
                    if not self._jobs:
                        self._thread = None
                        return
                    job = self._jobs[0]
                try:
                    job.run()
                except BaseException as exc:  # a strict failure: raised on the loop later
                    job.error = exc
                finally:
                    with self._cond:
                        self._jobs.popleft()
                        if job.error is not None:
                            self._errors.append(job.error)
                        self._cond.notify_all()
                    job.done.set()
        finally:
            hide_thread(me, hidden=False)

    def _forget_in_child(self) -> None:
        """A forked child saves nothing of the parent's (its thread did not survive)."""
        self._jobs = deque()
        self._cond = threading.Condition()
        self._thread = None
        self._waiters = 0


# -- the process: the exit and SIGTERM wait for every writer's windows ------------------------
_writers: weakref.WeakSet[WindowWriter] = weakref.WeakSet()
_exit_hooked = False
_sigterm_set = False


def _watch(writer: WindowWriter) -> None:
    global _exit_hooked
    _writers.add(writer)
    if not _exit_hooked:
        _exit_hooked = True  # registered late: runs before the hooks of torch and others
        atexit.register(wait_for_all, "the program exited")
    _set_sigterm()


def wait_for_all(why: str, timeout: float | None = None) -> list[str]:
    """Wait for every profile's windows to be saved (at most ``timeout``, default
    ``config.save_wait_s``), saying so on stderr; returns the windows not saved, each of them
    named on stderr."""
    writers = [w for w in list(_writers) if w.pending]
    if not writers:
        return []
    wait_s = config.save_wait_s if timeout is None else timeout
    waiting = [label for w in writers for label in w.labels()]
    _say(
        f"{why}: waiting up to {wait_s:g} s for {_count(waiting)} being saved: {', '.join(waiting)}"
    )
    deadline = time.monotonic() + wait_s
    left = [label for w in writers for label in w.wait(max(0.0, deadline - time.monotonic()))]
    for label in left:
        _say(f"{label} was not written: {why} and its save did not end within {wait_s:g} s")
    if left:
        remove_scratch()  # the process ends before they are complete: no file is left behind
    return left


def _count(labels: list[str]) -> str:
    return "1 window" if len(labels) == 1 else f"{len(labels)} windows"


def _say(line: str) -> None:
    with contextlib.suppress(Exception):  # a closed stderr must not turn into an error here
        print(f"stepscope: {line}", file=sys.stderr, flush=True)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM while windows are being saved: wait for them, then die of SIGTERM as before."""
    wait_for_all("the process received SIGTERM")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _set_sigterm() -> None:
    """Wait for the saves on SIGTERM, where the program leaves SIGTERM to its default action
    (only the main thread can set a handler; a program's own handler is never replaced)."""
    global _sigterm_set
    if _sigterm_set or threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
            _sigterm_set = True


def release_sigterm() -> None:
    """Give SIGTERM back to its default action once no window is being saved (called on the
    loop's thread; a handler the program set meanwhile stays)."""
    global _sigterm_set
    if not _sigterm_set or any(w.pending for w in list(_writers)):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _sigterm_set = False


def _after_fork_in_child() -> None:
    global _sigterm_set
    for writer in list(_writers):
        writer._forget_in_child()
    if _sigterm_set:  # nothing of the parent's is saved here: SIGTERM as the program set it
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _sigterm_set = False


after_fork_in_child(_after_fork_in_child)
