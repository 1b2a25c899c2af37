"""Pure-Python twin of the C ``StackSampler``: same constructor, ``sample()``, ``count()``,
``forget_before()``, ``interned()`` and ``export()``, built on ``sys._current_frames()``.

It interns (code object, line) frames directly (the C sampler keys on the instruction offset and
resolves lines at export); both export the same columns, so the rest of stepscope cannot tell
them apart.  Frame 0 is the ``[truncated]`` marker at the root of stacks cut at ``max_depth``.
"""

from __future__ import annotations

import sys
import threading
import time
from array import array
from collections.abc import Iterable
from types import CodeType, FrameType
from typing import Any

from stepscope import clock

__all__ = ["PyStackSampler", "thread_cpu_ns"]


def thread_cpu_ns(native_id: int) -> int:
    """CPU time of a thread in ns from its kernel id, or -1 when it cannot be read."""
    # The kernel's per-thread scheduler clock id, as the C sampler computes it.
    clock_id = ((~native_id & 0xFFFFFFFF) << 3 | 6) & 0xFFFFFFFF
    if clock_id >= 1 << 31:
        clock_id -= 1 << 32
    try:
        return time.clock_gettime_ns(clock_id)
    except (OSError, AttributeError, OverflowError):
        return -1


class PyStackSampler:
    """Bounded in-process stack samples of Python threads (twin of the C type)."""

    def __init__(
        self,
        max_samples: int,
        max_depth: int,
        thread_ids: Iterable[int] | None = None,
        idle_share: float = 0.2,
        idle_window_ns: int = 1_000_000,
    ) -> None:
        if max_samples < 0 or not 1 <= max_depth <= 100_000:
            raise ValueError("StackSampler needs max_samples >= 0 and 1 <= max_depth <= 100000")
        self.max_samples = max_samples
        self.max_depth = max_depth
        self.idle_share = idle_share
        self.idle_window_ns = idle_window_ns
        self.wanted = None if thread_ids is None else frozenset(int(t) for t in thread_ids)
        self.codes: list[CodeType | None] = [None]
        self._code_ids: dict[CodeType, int] = {}
        self._frame_ids: dict[tuple[CodeType, int], int] = {}
        self.frame_code = array("i", [0])
        self.frame_line = array("i", [0])
        self._stack_ids: dict[tuple[int, int], int] = {}
        self.stack_parent = array("i")
        self.stack_frame = array("i")
        self.sample_tid = array("q")
        self.sample_ts = array("q")
        self.sample_stack = array("i")
        self.sample_idle = array("B")
        self._clocks: dict[int, tuple[int, int, bool]] = {}
        self._native_ids: dict[int, int] = {}
        self.ticks = 0
        self.busy_ns = 0
        self.dropped = 0
        now = clock.now_ns()
        own = threading.get_ident()
        for ident in sys._current_frames():
            tid = self._native_id(ident)
            if ident != own and (self.wanted is None or tid in self.wanted):
                self._idle(tid, now)

    def _native_id(self, ident: int) -> int:
        tid = self._native_ids.get(ident)
        if tid is None:
            self._native_ids = {
                t.ident: t.native_id
                for t in threading.enumerate()
                if t.ident is not None and t.native_id is not None
            }
            tid = self._native_ids.get(ident, ident)
        return tid

    def _idle(self, tid: int, now: int) -> bool:
        previous = self._clocks.get(tid)
        if previous is not None and previous[0] >= 0 and now - previous[1] < self.idle_window_ns:
            return previous[2]  # too close to the last reading to judge again
        cpu = thread_cpu_ns(tid)
        idle = (
            previous is not None
            and previous[0] >= 0
            and cpu >= 0
            and now > previous[1]
            and cpu - previous[0] < self.idle_share * (now - previous[1])
        )
        self._clocks[tid] = (cpu, now, idle)
        return idle

    def _frame(self, code: CodeType, line: int) -> int:
        key = (code, line)
        fid = self._frame_ids.get(key)
        if fid is None:
            cid = self._code_ids.get(code)
            if cid is None:
                cid = self._code_ids[code] = len(self.codes)
                self.codes.append(code)
            fid = self._frame_ids[key] = len(self.frame_code)
            self.frame_code.append(cid)
            self.frame_line.append(line)
        return fid

    def _stack(self, parent: int, frame: int) -> int:
        key = (parent, frame)
        sid = self._stack_ids.get(key)
        if sid is None:
            sid = self._stack_ids[key] = len(self.stack_parent)
            self.stack_parent.append(parent)
            self.stack_frame.append(frame)
        return sid

    def _record(self, top: FrameType) -> int:
        fids: list[int] = []
        f: FrameType | None = top
        while f is not None and len(fids) < self.max_depth:
            fids.append(self._frame(f.f_code, f.f_lineno or f.f_code.co_firstlineno))
            f = f.f_back
        stack = self._stack(-1, 0) if f is not None else -1
        for fid in reversed(fids):
            stack = self._stack(stack, fid)
        return stack

    def sample(self) -> int:
        """Take one sample of every wanted thread but the caller; returns how many were recorded."""
        now = clock.now_ns()
        own = threading.get_ident()
        self.ticks += 1
        taken = 0
        for ident, top in sys._current_frames().items():
            if ident == own:
                continue
            tid = self._native_id(ident)
            if self.wanted is not None and tid not in self.wanted:
                continue
            if len(self.sample_ts) >= self.max_samples:
                self.dropped += 1
                continue
            stack = self._record(top)
            idle = self._idle(tid, now)
            self.sample_tid.append(tid)
            self.sample_ts.append(now)
            self.sample_stack.append(stack)
            self.sample_idle.append(1 if idle else 0)
            taken += 1
        self.busy_ns += clock.now_ns() - now
        return taken

    def count(self) -> int:
        """Samples recorded so far."""
        return len(self.sample_ts)

    def forget_before(self, ts_ns: int, /) -> int:
        """Drop the longest run of oldest samples taken before ``ts_ns``; returns how many."""
        ts = self.sample_ts
        n = 0
        while n < len(ts) and ts[n] < ts_ns:
            n += 1
        if n:
            for column in (self.sample_tid, self.sample_ts, self.sample_stack, self.sample_idle):
                del column[:n]
        return n

    def interned(self) -> tuple[int, int, int]:
        """(code objects, frames, stack nodes) interned so far."""
        return len(self.codes), len(self.frame_code), len(self.stack_parent)

    def export(self) -> dict[str, Any]:
        """Everything recorded so far, in the C sampler's export layout."""
        return {
            "codes": list(self.codes),
            "frame_code": self.frame_code.tobytes(),
            "frame_line": self.frame_line.tobytes(),
            "stack_parent": self.stack_parent.tobytes(),
            "stack_frame": self.stack_frame.tobytes(),
            "sample_tid": self.sample_tid.tobytes(),
            "sample_ts": self.sample_ts.tobytes(),
            "sample_stack": self.sample_stack.tobytes(),
            "sample_idle": self.sample_idle.tobytes(),
            "dropped": self.dropped,
            "ticks": self.ticks,
            "busy_ns": self.busy_ns,
            "native_tids": True,
        }
