"""Pure-Python twin of the C function tracer (``sys.setprofile``), with the same output.

Used when the C extension is unavailable, and in tests that check both give the same span tree.
It follows the C tracer step by step: frames are pushed on a per-thread stack at a call and
become records ``(start, dur, id, depth, flags)`` when they close; the budget, the drop policies
(whole chunks for "oldest"), the filters and the export to pre-order are the same.

Threads: the calling thread and threads started during the window are traced everywhere; threads
already running when the window starts are traced on Python 3.12+ only
(``threading.setprofile_all_threads``), as pure Python cannot reach them before that.  A thread
whose profile function is a C profiler (cProfile on 3.10/3.11) is left alone, since pure Python
cannot chain to it.
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections import deque
from collections.abc import Callable, Collection, Sequence
from types import CodeType, FrameType, ModuleType
from typing import Any

from stepscope import clock
from stepscope.collectors.python_common import (
    OPEN_AT_END,
    OPEN_AT_START,
    ThreadSpans,
    chunk_capacity,
)
from stepscope.trace.layouts import python_ids_ref

__all__ = ["TwinTracer"]

_SKIP = 0x100
_DROPPED = 0x200
_RECORD_FLAGS = 0x3
_SEARCH_LIMIT = 256
_OWN_C_MODULE = "stepscope._native"

Target = CodeType | str
Frame = list[Any]  # [key, intern id, flags, start]
Record = tuple[int, int, int, int, int]  # start, dur, intern id, depth, flags


class _Chunk:
    __slots__ = ("owner", "records")

    def __init__(self, owner: _Thread) -> None:
        self.owner = owner
        self.records: list[Record] = []


class _Thread:
    __slots__ = ("chunks", "count", "stack", "tid")

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self.stack: list[Frame] = []
        self.chunks: deque[_Chunk] = deque()
        self.count = 0


def _c_function_parts(func: Any) -> tuple[tuple[str, Any], str, str]:
    """(stack key, display name, module) of a builtin function or method, named as in C."""
    name = func.__name__
    owner = getattr(func, "__self__", None)
    if owner is None or isinstance(owner, ModuleType):
        module = func.__module__ if isinstance(func.__module__, str) else "builtins"
        return (name, module), f"<built-in function {name}>", module
    tp = type(owner)
    module = tp.__module__ if isinstance(tp.__module__, str) else "builtins"
    shown = tp.__qualname__ if module == "builtins" else f"{module}.{tp.__qualname__}"
    return (name, tp), f"<built-in method {name} of {shown} object>", module


class TwinTracer:
    """Records every Python call in a window with ``sys.setprofile`` (twin of the C tracer)."""

    implementation = "python"

    def __init__(self) -> None:
        self.active = False
        self._session = 0
        self._configured = False
        self._threads: list[_Thread] = []
        self._pending: dict[int, _Thread] = {}
        self._hidden: Callable[[], Collection[int]] | None = None
        self._reset_counters()

    # -- configuration ---------------------------------------------------------------------
    def configure(
        self,
        *,
        max_depth: int,
        min_ticks: int,
        trace_c: bool,
        drop_oldest: bool,
        budget: int,
        filter: Callable[[Target], bool] | None,
        ignore: Sequence[CodeType],
        hidden: Callable[[], Collection[int]] | None = None,
    ) -> None:
        """Set filters and budget for the next window (clears what was recorded); ``hidden``
        gives the native ids of threads never recorded (stepscope's own)."""
        if self.active:
            raise RuntimeError("the pure-Python tracer is recording; stop it before configuring")
        if budget < 1:
            raise ValueError("the event budget must be at least 1")
        self.clear()
        self.max_depth = max_depth
        self.min_ticks = min_ticks
        self.trace_c = trace_c
        self.drop_oldest = drop_oldest
        self.budget = budget
        self.chunk_cap = chunk_capacity(budget)
        self._filter = filter
        self._ignore = {id(c) for c in ignore} | {id(c) for c in _own_codes()}
        self._hidden = hidden
        self._configured = True

    def _is_hidden(self, native_id: int) -> bool:
        return self._hidden is not None and native_id in self._hidden()

    def _reset_counters(self) -> None:
        self._cache: dict[Any, tuple[int, bool]] = {}
        self._interned: list[Target | None] = []
        self._pins: list[Any] = []
        self._fifo: deque[_Chunk] = deque()
        self.kept = 0
        self.reserved = 0
        self.dropped = 0
        self.unbalanced = 0
        self.filter_errors = 0
        self.first_error: BaseException | None = None
        self.refused = 0

    # -- interning -------------------------------------------------------------------------
    def _ask(self, target: Target) -> bool:
        if self._filter is None:
            return True
        try:
            return bool(self._filter(target))
        except Exception as exc:  # reported at stop; the program goes on
            self.filter_errors += 1
            if self.first_error is None:
                self.first_error = exc
            return True

    def _intern_code(self, code: CodeType) -> tuple[int, bool]:
        key = id(code)
        found = self._cache.get(key)
        if found is None:
            include = key not in self._ignore and self._ask(code)
            found = (len(self._interned), include)
            self._interned.append(code if include else None)
            self._pins.append(code)
            self._cache[key] = found
        return found

    def _intern_c(self, func: Any) -> tuple[tuple[str, Any], int, bool] | None:
        try:
            key, name, module = _c_function_parts(func)
        except AttributeError:
            return None
        found = self._cache.get(key)
        if found is None:
            include = module != _OWN_C_MODULE and self._ask(module)
            found = (len(self._interned), include)
            self._interned.append(name if include else None)
            self._cache[key] = found
        return key, found[0], found[1]

    # -- stacks and records (mirrors tracer.c) -----------------------------------------------
    def _push(self, t: _Thread, key: Any, ident: int, flags: int, start: int) -> None:
        stack = t.stack
        depth = len(stack)
        if depth >= self.max_depth:
            flags |= _SKIP
        elif not self.drop_oldest:
            if (depth and stack[-1][2] & _DROPPED) or self.kept + self.reserved >= self.budget:
                flags |= _DROPPED
            else:
                self.reserved += 1
        stack.append([key, ident, flags, start])

    def _close_top(self, t: _Thread, now: int, extra: int) -> None:
        _key, ident, flags, start = t.stack.pop()
        if flags & _SKIP:
            return
        dur = now - start if now > start else 0
        if flags & _DROPPED:
            if dur >= self.min_ticks:
                self.dropped += 1
            return
        if not self.drop_oldest:
            self.reserved -= 1
        if dur < self.min_ticks:
            return
        self._append(t, (start, dur, ident, len(t.stack), (flags | extra) & _RECORD_FLAGS))

    def _append(self, t: _Thread, record: Record) -> None:
        if self.drop_oldest and self.kept >= self.budget:
            self._evict_oldest()
            if self.kept >= self.budget:
                self.dropped += 1
                return
        chunks = t.chunks
        if not chunks or len(chunks[-1].records) == self.chunk_cap:
            chunk = _Chunk(t)
            chunks.append(chunk)
            self._fifo.append(chunk)
        chunks[-1].records.append(record)
        self.kept += 1
        t.count += 1

    def _evict_oldest(self) -> None:
        fifo = self._fifo
        while self.kept >= self.budget and fifo:
            chunk = fifo.popleft()
            owner = chunk.owner
            n = len(chunk.records)
            self.dropped += n
            self.kept -= n
            owner.count -= n
            chunk.records = []
            if chunk is owner.chunks[-1]:
                fifo.append(chunk)  # the thread's only chunk, reused as the newest
            else:
                owner.chunks.popleft()

    def _pop(self, t: _Thread, key: Any, now: int) -> None:
        stack = t.stack
        lowest = max(0, len(stack) - _SEARCH_LIMIT)
        for i in range(len(stack) - 1, lowest - 1, -1):
            if stack[i][0] == key:
                self.unbalanced += len(stack) - 1 - i
                while len(stack) > i:
                    self._close_top(t, now, 0)
                return

    # -- events ------------------------------------------------------------------------------
    def _on_event(self, t: _Thread, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            ident, include = self._intern_code(frame.f_code)
            if include:
                self._push(t, frame.f_code, ident, 0, clock.now_ns())
        elif event == "return":
            now = clock.now_ns()
            code = frame.f_code
            stack = t.stack
            if stack and stack[-1][0] is code:
                self._close_top(t, now, 0)
            else:
                found = self._cache.get(id(code))
                if found is not None and found[1]:
                    self._pop(t, code, now)
        elif not self.trace_c:
            return
        elif event == "c_call":
            interned = self._intern_c(arg)
            if interned is not None and interned[2]:
                self._push(t, interned[0], interned[1], 0, clock.now_ns())
        elif event in ("c_return", "c_exception"):
            now = clock.now_ns()
            try:
                key = _c_function_parts(arg)[0]
            except AttributeError:
                return
            stack = t.stack
            if stack and stack[-1][0] == key:
                self._close_top(t, now, 0)
            else:
                self._pop(t, key, now)

    def _recorder(self, t: _Thread, chained: Any) -> Callable[[FrameType, str, Any], None]:
        session = self._session
        on_event = self._on_event

        def record(frame: FrameType, event: str, arg: Any) -> None:
            if chained is not None and event in ("call", "c_call"):
                chained(frame, event, arg)
            if self.active and self._session == session:
                on_event(t, frame, event, arg)
            else:
                sys.setprofile(None)  # a window that ended: uninstall from this thread
                return
            if chained is not None and event not in ("call", "c_call"):
                chained(frame, event, arg)

        return record

    def _thread_hook(self, frame: FrameType, event: str, arg: Any) -> None:
        """Profile function of threads not yet hooked: installs their recorder."""
        if not self.active:
            sys.setprofile(None)
            return
        t = self._pending.pop(threading.get_ident(), None)
        if t is None:
            if self._is_hidden(threading.get_native_id()):
                sys.setprofile(None)
                return
            t = _Thread(threading.get_native_id())
            self._threads.append(t)
        recorder = self._recorder(t, None)
        sys.setprofile(recorder)
        recorder(frame, event, arg)

    # -- window ------------------------------------------------------------------------------
    def start(self, native_ids: dict[int, int] | None = None) -> None:
        """Begin recording on this thread, on new threads, and on running ones (3.12+)."""
        if not self._configured:
            raise RuntimeError("configure the pure-Python tracer before starting it")
        if self.active:
            raise RuntimeError("the pure-Python tracer is already recording")
        self._session += 1
        self.start_ticks = clock.now_ns()
        me = threading.get_ident()
        all_threads = sys.version_info >= (3, 12)
        ids = native_ids or {
            t.ident: t.native_id
            for t in threading.enumerate()
            if t.ident is not None and t.native_id is not None
        }
        mine: _Thread | None = None
        for ident, top in sys._current_frames().items():
            if ident != me and not all_threads:
                continue
            t = _Thread(threading.get_native_id() if ident == me else ids.get(ident) or ident)
            if self._is_hidden(t.tid):
                continue
            self._threads.append(t)
            chain: list[FrameType] = []
            frame: FrameType | None = top
            while frame is not None:
                chain.append(frame)
                frame = frame.f_back
            for f in reversed(chain):
                ident_, include = self._intern_code(f.f_code)
                if include:
                    self._push(t, f.f_code, ident_, OPEN_AT_START, self.start_ticks)
            if ident == me:
                mine = t
            else:
                self._pending[ident] = t
        self._prev_thread_hook = threading.getprofile()
        self._prev_profile = sys.getprofile()
        self.active = True
        # New threads first: once the hook is on this thread, the call would be recorded.
        threading.setprofile(self._thread_hook)
        if all_threads:
            threading.setprofile_all_threads(self._thread_hook)  # type: ignore[attr-defined]
        if mine is not None:
            chained = self._prev_profile
            if chained is not None and not callable(chained):
                self.refused += 1  # a C profiler (cProfile): cannot chain, so leave it be
            else:
                sys.setprofile(self._recorder(mine, chained))

    def stop(self) -> dict[str, Any]:
        """Stop recording; frames still open are closed at the window end."""
        if not self.active:
            raise RuntimeError("the pure-Python tracer is not recording")
        self.active = False  # from here on, recorders ignore events and uninstall themselves
        if sys.version_info >= (3, 12):
            threading.setprofile_all_threads(None)  # type: ignore[attr-defined]
        prev = self._prev_profile
        sys.setprofile(prev if prev is not None and callable(prev) else None)
        threading.setprofile(self._prev_thread_hook)
        self._pending.clear()
        self.end_ticks = clock.now_ns()
        for t in self._threads:
            while t.stack:
                self._close_top(t, self.end_ticks, OPEN_AT_END)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        """Counters of the current session (same keys as the C tracer's)."""
        return {
            "events": self.kept,
            "dropped": self.dropped,
            "budget": self.budget if self._configured else 0,
            "threads": len(self._threads),
            "interned": len(self._interned),
            "unbalanced": self.unbalanced,
            "displaced": self.refused,
            "filter_errors": self.filter_errors,
            "first_filter_error": self.first_error,
        }

    def interned(self) -> list[Target | None]:
        """Interned code objects / C names by id (None for excluded ones)."""
        return list(self._interned)

    def export(
        self, name_ids: Sequence[int], first_id: int = 1, first_row: int = 0
    ) -> list[ThreadSpans]:
        """Each thread's spans in pre-order (twin of the C export)."""
        if self.active:
            raise RuntimeError("stop the pure-Python tracer before exporting")
        out = []
        next_id = first_id
        for t in self._threads:
            if t.count:
                out.append(_export_thread(t, name_ids, next_id, first_row + next_id - first_id))
                next_id += t.count
        return out

    def clear(self) -> None:
        """Forget everything recorded."""
        if self.active:
            raise RuntimeError("stop the pure-Python tracer before clearing it")
        self._threads = []
        self._pending = {}
        self._reset_counters()


def _export_thread(
    t: _Thread, name_ids: Sequence[int], first_id: int, first_row: int
) -> ThreadSpans:
    records = [r for chunk in t.chunks for r in chunk.records]
    n = len(records)
    parent = [-1] * n
    first_child = [-1] * n
    next_sib = [-1] * n
    root_head = -1
    ancestors: list[int] = []
    for j in range(n - 1, -1, -1):
        depth = records[j][3]
        while ancestors and records[ancestors[-1]][3] >= depth:
            ancestors.pop()
        p = ancestors[-1] if ancestors and records[ancestors[-1]][3] + 1 == depth else -1
        parent[j] = p
        if p >= 0:
            next_sib[j] = first_child[p]
            first_child[p] = j
        else:
            next_sib[j] = root_head
            root_head = j
        ancestors.append(j)
    pos = [0] * n
    cols = (array("I"), array("q"), array("q"), array("q"), array("q"))
    names, starts, durs, ids, parents = cols
    flags = bytearray()
    n_names = len(name_ids)
    node = root_head
    out = 0
    while node >= 0:
        start, dur, code, _depth, flag = records[node]
        pos[node] = out
        names.append(name_ids[code] if code < n_names else 0)
        starts.append(start)
        durs.append(dur)
        ids.append(first_id + out)
        parents.append(first_id + pos[parent[node]] if parent[node] >= 0 else 0)
        flags.append(flag)
        out += 1
        if first_child[node] >= 0:
            node = first_child[node]
            continue
        while node >= 0 and next_sib[node] < 0:
            node = parent[node]
        if node >= 0:
            node = next_sib[node]
    refs = array("i", range(python_ids_ref(first_row), python_ids_ref(first_row + n), -1))
    return ThreadSpans(t.tid, names, starts, durs, ids, parents, bytes(flags), refs)


def _own_codes() -> list[CodeType]:
    """This module's functions: never recorded (they run inside the window)."""
    codes = []
    for value in list(TwinTracer.__dict__.values()):
        code = getattr(value, "__code__", None)
        if code is not None:
            codes.append(code)
    return codes
