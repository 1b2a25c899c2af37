"""Pieces the function tracer's two implementations share: options, module filters, span names,
and the rows they export.

Both implementations (the C tracer in ``stepscope._native`` and the pure-Python twin) export the
same thing per thread: span columns in pre-order with ``Python id`` / ``Python parent id``
numbers, which :func:`add_python_spans` appends to a ``TraceBuilder``.
"""

from __future__ import annotations

import os
import re
import sys
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from types import CodeType
from typing import Any, NamedTuple

from stepscope.trace.model import TraceBuilder
from stepscope.trace.names import is_hidden

__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "DROP_POLICIES",
    "OPEN_AT_END",
    "OPEN_AT_START",
    "PYTHON_CATEGORY",
    "RECORD_BYTES",
    "ModuleFilter",
    "SourceNames",
    "ThreadSpans",
    "TracerOptions",
    "add_python_spans",
    "chunk_capacity",
    "fill_span_columns",
]

PYTHON_CATEGORY = "python_function"
RECORD_BYTES = 20
"""Size of one recorded call in the C tracer's buffers."""
DEFAULT_BUFFER_BYTES = 64 << 20
DROP_POLICIES = ("oldest", "newest")
OPEN_AT_START = 1
"""Flag: the frame was already running when the window started (its start is the window's)."""
OPEN_AT_END = 2
"""Flag: the frame was still running when the window ended (its end is the window's)."""
ARG_OPEN_AT_START = "Open at window start"
ARG_OPEN_AT_END = "Open at window end"
MAX_DEPTH_LIMIT = 0xFFFF


def chunk_capacity(budget: int) -> int:
    """Records per buffer chunk; the "oldest" policy evicts a chunk at a time (same in C)."""
    return max(1, min(8192, budget // 8))


@dataclass(frozen=True)
class TracerOptions:
    """What the function tracer records and how much memory it may use per window."""

    max_depth: int | None = None
    """Record calls at most this many levels deep (1 = only the outermost); None: no limit."""
    include: tuple[str, ...] = ()
    """Module globs to record (empty: all); a glob also matches submodules ("pkg" -> "pkg.x")."""
    exclude: tuple[str, ...] = ()
    """Module globs never recorded (wins over ``include``); their callees still are."""
    min_duration_ns: int = 0
    """Calls shorter than this are not recorded."""
    trace_c_functions: bool = False
    """Also record calls of C functions (builtins)."""
    event_budget: int | None = None
    """Most calls kept per window; None: ``buffer_bytes`` / 20 (the size of one record)."""
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    """Memory for recorded calls per window, used when ``event_budget`` is None."""
    drop_policy: str = "oldest"
    """Past the budget, drop the "oldest" recorded calls (keep the latest) or the "newest"."""

    def __post_init__(self) -> None:
        if self.max_depth is not None and (
            isinstance(self.max_depth, bool)
            or not isinstance(self.max_depth, int)
            or self.max_depth < 1
        ):
            raise ValueError(f"max_depth must be a positive int or None, got {self.max_depth!r}")
        for field_name in ("include", "exclude"):
            globs = getattr(self, field_name)
            if isinstance(globs, str) or not all(isinstance(g, str) and g for g in globs):
                raise TypeError(
                    f"{field_name} must be a sequence of non-empty module globs "
                    f"(e.g. ('mypkg', 'torch.nn.*')), got {globs!r}"
                )
            object.__setattr__(self, field_name, tuple(globs))
        if isinstance(self.min_duration_ns, bool) or not isinstance(self.min_duration_ns, int):
            raise TypeError(f"min_duration_ns must be an int, got {self.min_duration_ns!r}")
        if self.min_duration_ns < 0:
            raise ValueError(f"min_duration_ns must be >= 0, got {self.min_duration_ns}")
        if self.event_budget is not None and (
            isinstance(self.event_budget, bool)
            or not isinstance(self.event_budget, int)
            or self.event_budget < 1
        ):
            raise ValueError(
                f"event_budget must be a positive int or None, got {self.event_budget!r}"
            )
        if (
            isinstance(self.buffer_bytes, bool)
            or not isinstance(self.buffer_bytes, int)
            or self.buffer_bytes < RECORD_BYTES
        ):
            raise ValueError(
                f"buffer_bytes must be an int of at least {RECORD_BYTES}, got {self.buffer_bytes!r}"
            )
        if self.drop_policy not in DROP_POLICIES:
            raise ValueError(f"drop_policy must be 'oldest' or 'newest', got {self.drop_policy!r}")

    @property
    def budget(self) -> int:
        """Most calls kept per window."""
        if self.event_budget is not None:
            return self.event_budget
        return self.buffer_bytes // RECORD_BYTES

    @property
    def depth_limit(self) -> int:
        """``max_depth`` as a number (no limit = the largest recordable depth)."""
        return MAX_DEPTH_LIMIT if self.max_depth is None else min(self.max_depth, MAX_DEPTH_LIMIT)

    def filter_key(self) -> tuple[Any, ...]:
        """What decides which code is excluded (a change needs sys.monitoring's restart)."""
        return (self.include, self.exclude)


class SourceNames:
    """Short display paths and module names of source files, relative to ``sys.path``."""

    def __init__(self, paths: Iterable[str] | None = None) -> None:
        roots = set()
        for entry in sys.path if paths is None else paths:
            root = os.path.abspath(entry or os.curdir)
            if os.path.isdir(root):
                roots.add(root.rstrip(os.sep) + os.sep)
        # Longest first, so site-packages wins over the lib directory that contains it.
        self._roots = sorted(roots, key=len, reverse=True)
        self._short: dict[str, str] = {}
        self._modules: dict[str, str] = {}

    def short_path(self, filename: str) -> str:
        """``filename`` relative to the deepest ``sys.path`` entry containing it (else as is)."""
        short = self._short.get(filename)
        if short is None:
            short = filename
            if os.path.isabs(filename):
                for root in self._roots:
                    if filename.startswith(root):
                        short = filename[len(root) :]
                        break
            self._short[filename] = short
        return short

    def module(self, filename: str) -> str:
        """The dotted module name a source file is imported as (best effort)."""
        module = self._modules.get(filename)
        if module is None:
            module = self._module_of(filename)
            self._modules[filename] = module
        return module

    def _module_of(self, filename: str) -> str:
        if filename.startswith("<frozen ") and filename.endswith(">"):
            return filename[len("<frozen ") : -1]
        if filename.startswith("<"):
            return filename
        short = self.short_path(filename)
        if os.path.isabs(short):
            short = os.path.basename(short)
        stem, _ = os.path.splitext(short)
        parts = [p for p in stem.split(os.sep) if p]
        if len(parts) > 1 and parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    def span_name(self, target: CodeType | str) -> str:
        """torch's name for a Python function span: ``file(line): qualname``."""
        if isinstance(target, str):
            return target  # a C function's name, already formatted
        qualname = getattr(target, "co_qualname", target.co_name)
        return f"{self.short_path(target.co_filename)}({target.co_firstlineno}): {qualname}"


def _glob_matches(module: str, glob: str) -> bool:
    return fnmatchcase(module, glob) or fnmatchcase(module, glob + ".*")


class ModuleFilter:
    """Decides once per code object (or C function's module) whether it is recorded.

    Code that is stepscope's own or a launcher's (``trace.names.is_hidden``: stepscope's
    package, ``runpy``, the ``stepscope`` console script) is never recorded, whatever the globs
    say; calls it makes still are.
    """

    def __init__(self, include: Sequence[str], exclude: Sequence[str], names: SourceNames) -> None:
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self._names = names
        self._decided: dict[str, bool] = {}

    @property
    def active(self) -> bool:
        """Whether anything is left out (otherwise everything is recorded)."""
        return True  # stepscope's own code is always left out

    def module_included(self, module: str) -> bool:
        """Whether calls from ``module`` are recorded."""
        decided = self._decided.get(module)
        if decided is None:
            if any(_glob_matches(module, g) for g in self.exclude):
                decided = False
            elif self.include:
                decided = any(_glob_matches(module, g) for g in self.include)
            else:
                decided = True
            self._decided[module] = decided
        return decided

    def __call__(self, target: CodeType | str) -> bool:
        """Decision for a code object, or for a C function given its module name."""
        if isinstance(target, str):
            return self.module_included(target)
        filename = target.co_filename
        if is_hidden(filename):
            return False
        return self.module_included(self._names.module(filename))


class ThreadSpans(NamedTuple):
    """One thread's exported spans in pre-order (all columns the same length)."""

    tid: int
    name_ids: array[int]
    starts: array[int]
    durs: array[int]
    ids: array[int]
    parents: array[int]
    """Parent's ``Python id``; 0 for roots."""
    flags: bytes
    refs: array[int]
    """Args refs: ``python_ids_ref(row)`` of consecutive ``python_ids`` rows."""


_FLAGGED = re.compile(rb"[^\x00]")


def span_args(py_id: int, parent: int, flags: int) -> dict[str, Any]:
    """The args of one python_function span."""
    args: dict[str, Any] = {"Python id": py_id, "Python parent id": parent or None}
    if flags & OPEN_AT_START:
        args[ARG_OPEN_AT_START] = True
    if flags & OPEN_AT_END:
        args[ARG_OPEN_AT_END] = True
    return args


SpanExporter = Callable[[int, tuple[memoryview, ...]], tuple[bytes, list[int]]]
"""``export(first_row, columns)``: write every recorded span into the seven columns (name ids,
tids, starts, durs, args refs, Python ids, parent ids), return their flags (one byte each) and
the tids they hold."""


def add_python_spans(builder: TraceBuilder, pid: int, count: int, export: SpanExporter) -> int:
    """Append ``count`` recorded calls as ``python_function`` spans; returns how many.

    The exporter writes straight into the trace's columns; ids go to its ``python_ids`` columns
    (no dict per span).  Only the few spans open at the window's start or end get an args dict,
    which also carries their flags.
    """
    if count == 0:
        return 0
    fill = {"cat": builder.intern(PYTHON_CATEGORY), "pid": builder.encode_label(pid)}
    first_row = builder.python_ids_rows
    first_span = builder.span_rows
    with builder.grown("spans", count, fill) as spans, builder.grown("python_ids", count) as ids:
        refs, py_ids, parents = spans["args"], ids["id"], ids["parent"]
        cols = (spans["name"], spans["tid"], spans["start_ns"], spans["dur_ns"], refs)
        flags, tids = export(first_row, (*cols, py_ids, parents))
        for match in _FLAGGED.finditer(flags):
            i = match.start()
            refs[i] = builder.add_args(span_args(py_ids[i], parents[i], flags[i]))
    builder.note_span_tracks(first_span, first_span + count, {(fill["pid"], t) for t in tids})
    return count


def fill_span_columns(
    threads: Sequence[ThreadSpans], cols: tuple[memoryview, ...]
) -> tuple[bytes, list[int]]:
    """Write exported threads into the columns of :data:`SpanExporter` (the twin's way)."""
    at = 0
    flags = bytearray()
    for t in threads:
        k = len(t.name_ids)
        tids = array("q", [t.tid]) * k
        sources = (t.name_ids, tids, t.starts, t.durs, t.refs, t.ids, t.parents)
        for col, src in zip(cols, sources, strict=True):
            col[at : at + k] = memoryview(src)
        flags += t.flags
        at += k
    if at != len(cols[0]):
        raise ValueError(f"exported {at} spans into columns of {len(cols[0])}")
    return bytes(flags), [t.tid for t in threads]


def name_ids_for(
    builder: TraceBuilder, targets: Sequence[CodeType | str | None], names: SourceNames
) -> array[int]:
    """Builder string ids of the span names of interned targets (0 for excluded ones)."""
    intern = builder.intern
    return array("I", (0 if t is None else intern(names.span_name(t)) for t in targets))
