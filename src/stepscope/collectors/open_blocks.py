"""torch ``record_function`` blocks that a stopped torch session left open, and their exits.

torch's profiler ends a ``record_function`` block with the callback of the session that was
recording when the block began, and that callback writes the block's end into the event buffer
of whichever session records *now*: the one that began it has freed its buffers at its stop.  So a
session started while a block of the previous one is still open makes torch write into freed
memory when that block ends (heap corruption, then a segfault somewhere later; torch.profiler does
the same when ``prof.step()`` is called inside a ``record_function`` block and the next window
starts at once).  A stepscope window that ends in the optimizer's step post-hook
(``step_on="optimizer"``) always ends inside torch's own ``Optimizer.step#...`` block.

The torch collector therefore starts the next session only once the blocks its last session left
open (Kineto marks them ``"finished": false``) have exited.  :class:`ExitWatch` sees them exit: a
profile function on the thread that stopped the session (``sys.setprofile``, only where no profile
function is set; stepscope's own function tracer chains it) that watches the returns of torch's
``record_function.__exit__``, and removes itself as soon as the last one has returned.  It gives
up after :data:`WATCH_LIMIT_NS` (a block open that long is not one that ends with its step).
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

from stepscope.trace.model import Trace

__all__ = [
    "ENDS_WITH_ITS_STEP",
    "WATCH_LIMIT_NS",
    "ExitWatch",
    "LeftOpen",
    "any_left_open",
    "blocks_left_open",
]

WATCH_LIMIT_NS = 2_000_000_000
"""The watch gives up after this long (its profile function costs every Python call)."""
ENDS_WITH_ITS_STEP = ("Optimizer.step#", "Optimizer.zero_grad#")
"""torch's own blocks that end before the next step can: a later step boundary closes them."""
_UNFINISHED = b'"finished": false'
_FINISHED_KEY = b'"finished"'


def any_left_open(path: str) -> bool:
    """Whether Kineto's file ``path`` marks any block ``"finished": false`` (one scan in C)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(_UNFINISHED) >= 0


def blocks_left_open(trace: Trace, tid: int) -> list[str]:
    """Names of the blocks on thread ``tid`` that were still open when the session stopped
    (Kineto's ``"finished": false``), read from its ``trace``."""
    spans, strings = trace.spans, trace.strings
    names = []
    for i in range(len(spans)):
        if trace.label(spans["tid"][i]) != tid:
            continue
        args = trace.args_at(spans["args"][i])
        if args is None:
            continue
        raw = getattr(args, "raw", None)  # args kept as their JSON text: parse only a candidate
        if raw is not None and _FINISHED_KEY not in raw:
            continue
        if args.get("finished") is False:
            names.append(strings[spans["name"][i]])
    return names


class LeftOpen:
    """The blocks a stopped session left open, as its ``collect`` finds them in Kineto's file.

    When the window is saved off the loop, the answer comes from the writer thread after the
    stop; the loop takes it before it starts the next session (``wait``)."""

    def __init__(self, tid: int, step: int | None) -> None:
        self.tid = tid
        """Native id of the thread that stopped the session (the one the blocks are on)."""
        self.step = step
        """The step at the stop."""
        self.names: list[str] = []
        self._ready = threading.Event()

    def found(self, names: list[str]) -> None:
        """The blocks left open (by ``collect``, also when it failed: none); the first answer
        is the one the loop takes."""
        if not self._ready.is_set():
            self.names = names
            self._ready.set()

    def wait(self, timeout: float | None) -> bool:
        """Whether the answer is known (after waiting up to ``timeout`` seconds for it)."""
        return self._ready.wait(timeout)


class ExitWatch:
    """Calls ``on_done`` on this thread once the blocks counted in ``waiting`` have exited (one
    exit of torch's ``record_function`` per count), or never if it gives up (``gave_up``)."""

    def __init__(
        self, waiting: Counter[str], exit_code: CodeType, on_done: Callable[[], None]
    ) -> None:
        self.waiting = waiting
        """Blocks still awaited, by name (shared with the caller, who may forget some)."""
        self.exit_code = exit_code
        self.on_done = on_done
        self.done = False
        self.gave_up = False
        self.thread = threading.get_ident()
        self._deadline = time.monotonic_ns() + WATCH_LIMIT_NS
        self._events = 0
        self._fn = self._event  # the one bound method set, so that it can be recognized

    @property
    def live(self) -> bool:
        """Watching still (installed, neither done nor given up)."""
        return not self.done and not self.gave_up

    def install(self) -> bool:
        """Set the profile function on this thread; False where another one is set."""
        if sys.getprofile() is not None:
            return False
        sys.setprofile(self._fn)
        return True

    def cancel(self) -> None:
        """Stop watching (removed now if it is this thread's profile function, else at its
        next call: stepscope's tracer, chained above it, hands calls down until it stops)."""
        if self.live:
            self.gave_up = True
        self._leave()

    def _leave(self) -> None:
        if threading.get_ident() == self.thread and sys.getprofile() is self._fn:
            sys.setprofile(None)

    def _event(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.live:
            self._leave()
            return
        if event != "return" or frame.f_code is not self.exit_code:
            self._events += 1
            if self._events & 1023 == 0 and time.monotonic_ns() > self._deadline:
                self.cancel()
            return
        name = getattr(frame.f_locals.get("self"), "name", None)
        if not isinstance(name, str) or self.waiting[name] <= 0:
            return
        self.waiting[name] -= 1
        if self.waiting[name] == 0:
            del self.waiting[name]
        if not self.waiting:
            self.done = True
            self._leave()
            self.on_done()
