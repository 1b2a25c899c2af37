"""Types of the C extension ``stepscope._native`` (sources in ``src/stepscope/_csrc/``).

One declaration per entry point the C parts register (their ``PyMethodDef`` tables and
``PyModule_Add*`` calls), so ``mypy --strict`` checks every call into C.  Code reaches the
module only through :func:`stepscope._ext.native` / :func:`stepscope._ext.resolve`, which return
it typed as this stub (or ``None`` when the twins run).  ``tests/test_native_stub.py`` holds the
stub and the built module to the same names.  Twins: ``clock.py`` (clock),
``trace/chrome_writer.py`` and ``trace/chrome_reader.py`` (Chrome), ``trace/nesting.py`` (span
nesting), ``collectors/annotations.py`` (record_function), ``collectors/python_twin.py``
(tracer), ``collectors/sampler_twin.py`` (sampler).
"""

from collections.abc import Callable, Collection, Mapping, Sequence
from types import CodeType, FrameType, TracebackType
from typing import Any, Final, Literal, TypedDict, TypeVar, final

from _typeshed import ReadableBuffer, WriteableBuffer

_F = TypeVar("_F", bound=Callable[..., Any])

_SpanColumnBytes = tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes]
"""The seven span columns (name, cat, pid, tid, start_ns, dur_ns, args) in machine order."""

# -- clock.c ---------------------------------------------------------------------------------

def _clock_configure(want_tsc: bool, calibrate_seconds: float = 0.002, /) -> bool:
    """Select the TSC (when wanted and invariant) or CLOCK_MONOTONIC; whether the TSC is used."""

def _clock_refine() -> int | None:
    """Lengthen the TSC baseline; the offset from CLOCK_MONOTONIC in ns (None off the TSC)."""

def now_ns() -> int:
    """Monotonic time in ns."""

def ticks() -> int:
    """Raw clock ticks (TSC or ns)."""

def ticks_to_ns(ticks: int, /) -> int:
    """Raw ticks to monotonic ns."""

def ticks_per_second() -> float:
    """The calibrated tick rate (1e9 off the TSC)."""

# -- chrome_writer.c ---------------------------------------------------------------------------

def format_spans(
    cols: tuple[ReadableBuffer, ...],
    lo: int,
    hi: int,
    strings: list[bytes],
    args: tuple[Mapping[str, Any], ...],
    fallback: Callable[[Any], bytes],
    shift: int,
    /,
) -> bytes:
    """Spans ``lo..hi`` of the seven columns as Chrome ``X`` events, each ending ``,\\n``."""

# -- chrome_columns.c, chrome_scanner.c --------------------------------------------------------

def spans_from_events(
    events: list[Any],
    string_ids: dict[str, int],
    strings: list[str],
    args_store: list[Any],
    skip_cat: str,
    /,
) -> tuple[list[int], _SpanColumnBytes]:
    """Plain ``X`` events as span columns (interning in place); the indices of the others."""

def remap_column(
    column: ReadableBuffer, mode: int, table: ReadableBuffer | None, offset: int, /
) -> bytes:
    """A column re-based for another builder: mode 0 string ids and 1 pid/tid labels through
    ``table``, 2 times and 3 args refs (-1 stays) plus ``offset``."""

def pack_varints(
    column: ReadableBuffer,
    typecode: str,
    delta: bool,
    floor: int = ...,
    empty: ReadableBuffer = ...,
    /,
) -> bytes:
    """A column (typecode B, I, i or q) as LEB128 varints, zigzag for signed or delta-coded;
    values below ``floor``, and those that index a zero of the int64 column ``empty``, are
    written as ``floor``."""

def unpack_varints(
    data: ReadableBuffer, offset: int, count: int, typecode: str, delta: bool, /
) -> tuple[bytes, int]:
    """``count`` varints from ``offset`` back to the column's bytes, and the end offset."""

def column_min(column: ReadableBuffer, /) -> int | None:
    """The smallest value of an int64 (typecode q) column, None when it is empty."""

def split_args(
    args: Sequence[object], raw_type: type, fallback: Callable[[object], bytes], /
) -> tuple[bytes, bytes]:
    """The compact form's ARGS payload (version 2: templates and integer columns) of args
    mappings (a ``raw_type`` object's own ``raw`` text, any other through ``fallback``), and
    each one's key count as int64 bytes."""

def splice_args(payload: ReadableBuffer, /) -> tuple[list[bytes], bytes]:
    """Each mapping's text back from an ARGS payload, and the key counts as int64 bytes."""

def int_args(
    rows: Sequence[object], keys: tuple[bytes, ...], /
) -> list[tuple[int | None, ...] | None]:
    """Per row (args text as bytes, None for no args, anything else for Python to read) the keys'
    integer values (None when absent), or None where Python must read the row."""

def scan_trace(
    data: ReadableBuffer,
    string_ids: dict[str, int],
    strings: list[str],
    args_store: list[Any],
    skip_cat: str,
    raw_args_type: Callable[[bytes, int], Any],
    loads: Callable[[str], Any],
    flow_id: Callable[[str], int],
    drop: bool,
    /,
) -> (
    tuple[
        bytes,
        list[tuple[int, Any]],
        tuple[tuple[bytes, ...], ...],
        tuple[int, int],
        tuple[tuple[bytes, ...], list[str]] | None,
    ]
    | None
):
    """(document without its events and samples, (index, event) of non-plain events, the
    columns of the spans, instants, flows, meta and counters tables and of the spans closed from
    B/E pairs, (unmatched E events, B events left open), (sample columns with each sample's index
    into the distinct stack-frame keys, those keys) or None without a samples list), or None
    when the text is not one the scanner reads (``json.loads`` decides then)."""

# -- span_nesting.c ----------------------------------------------------------------------------

def nest_spans(
    pid: ReadableBuffer,
    tid: ReadableBuffer,
    start_ns: ReadableBuffer,
    dur_ns: ReadableBuffer,
    names: ReadableBuffer,
    step_names: ReadableBuffer,
    /,
) -> tuple[bytes, bytes, bytes]:
    """Per span (int64 pid, tid, start, dur; uint32 name ids; a byte per string id, 1 for a
    ``ProfilerStep#N``): its parent (int32, -1 at the root), self ns (int64) and fold flag
    (int8)."""

# -- annotations.c -----------------------------------------------------------------------------

_SpanTuple = tuple[str, Any, int, int, int]
"""A recorded span: (name, args, start_ns, end_ns, native thread id)."""

@final
class RecordFunction:
    """``record_function(name, args=None)``: a span around a block (context manager/decorator)."""

    def __init__(self, name: str, args: Any = None) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def args(self) -> Any: ...
    def __enter__(self) -> RecordFunction: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> Literal[False]: ...
    def __call__(self, fn: _F, /) -> _F: ...

def _annotations_start(sink: list[_SpanTuple], max_spans: int, /) -> None:
    """Record completed spans into ``sink`` (at most ``max_spans``; 0 = no limit)."""

def _annotations_stop() -> tuple[int, int]:
    """Stop recording: (spans closed at the window end, spans dropped over the budget)."""

def _annotations_recording() -> bool:
    """Whether a window is recording."""

def _annotations_emit(name: str, args: Any, start_ns: int, end_ns: int, /) -> bool:
    """Add an already-timed span on the calling thread; whether a window took it."""

def _annotations_set_bridge(
    enter: Callable[[str, Any], Any] | None, exit: Callable[[Any], Any] | None, /
) -> int:
    """Also open another profiler's span per recorded block (None, None: stop); the bridge
    errors since the last call."""

def _annotations_set_decorator(decorate: Callable[[str, Any, _F], _F], /) -> None:
    """The Python helper ``RecordFunction.__call__`` wraps functions with."""

# -- tracer.c ----------------------------------------------------------------------------------

TRACER_RECORD_BYTES: Final[int]
"""Bytes of one recorded call."""

class _TracerStats(TypedDict):
    """Counters of the tracer's session (``_tracer_stop`` / ``_tracer_stats``)."""

    events: int
    dropped: int
    chunk_bytes: int
    peak_chunk_bytes: int
    budget: int
    threads: int
    interned: int
    unbalanced: int
    lost: int
    displaced: int
    filter_errors: int
    first_filter_error: BaseException | None
    record_bytes: int

def _tracer_configure(
    max_depth: int,
    min_ticks: int,
    trace_c: bool,
    drop_oldest: bool,
    budget: int,
    filter: Callable[[CodeType | str], object] | None,
    ignore: tuple[CodeType, ...],
    disable: object,
    native_ids: dict[int, int],
    tsc: bool = False,
    hidden: Callable[[], Collection[int]] | None = None,
) -> None:
    """Set the filters and the event budget of the next window (not while recording)."""

def _tracer_start(mode: Literal["monitoring", "profile"], /) -> None:
    """Start recording: ``monitoring`` on 3.12+, ``profile`` on 3.10/3.11."""

def _tracer_stop() -> _TracerStats:
    """Stop recording, closing the frames still open; the session's counters."""

def _tracer_stats() -> _TracerStats:
    """The session's counters so far."""

def _tracer_interned() -> list[CodeType | str | None]:
    """Interned targets by id: code objects, C-function names, None for excluded ones."""

def _tracer_export(
    name_ids: ReadableBuffer,
    first_id: int,
    first_row: int,
    names: WriteableBuffer,
    tids: WriteableBuffer,
    starts: WriteableBuffer,
    durs: WriteableBuffer,
    refs: WriteableBuffer,
    ids: WriteableBuffer,
    parents: WriteableBuffer,
    /,
) -> tuple[bytes, list[int]]:
    """Write every span in pre-order into the columns (``name_ids``: uint32 string id per
    interned target); returns their flags and the threads' native ids."""

def _tracer_clear() -> None:
    """Free every buffer and interned reference (not while recording)."""

def _tracer_active() -> bool:
    """Whether the tracer is recording."""

def _tracer_thread_hook(frame: FrameType, event: str, arg: Any, /) -> None:
    """``threading.setprofile`` target installing the C profile function in new threads."""

# sys.monitoring callbacks (3.12+); each returns sys.monitoring.DISABLE or None.
def _mon_py_start(code: CodeType, offset: int, /) -> object: ...
def _mon_py_throw(code: CodeType, offset: int, exc: BaseException, /) -> object: ...
def _mon_py_return(code: CodeType, offset: int, retval: object, /) -> object: ...
def _mon_py_unwind(code: CodeType, offset: int, exc: BaseException, /) -> object: ...
def _mon_call(code: CodeType, offset: int, callable: object, arg0: object, /) -> object: ...
def _mon_c_end(code: CodeType, offset: int, callable: object, arg0: object, /) -> object: ...

# -- sampler.c ---------------------------------------------------------------------------------

class _SamplerExport(TypedDict):
    """Everything a ``StackSampler`` recorded: interned codes, columns (bytes), counters."""

    codes: list[CodeType | None]
    frame_code: bytes
    frame_line: bytes
    stack_parent: bytes
    stack_frame: bytes
    sample_tid: bytes
    sample_ts: bytes
    sample_stack: bytes
    sample_idle: bytes
    dropped: int
    ticks: int
    busy_ns: int
    native_tids: bool

class _SignalStats(TypedDict):
    """Counters of a signal-sampling run (``StackSampler.stop_signals``)."""

    ticks: int
    signals: int
    handled: int
    late: int
    no_frames: int
    ring_full: int
    handler_ns: int
    threads: int
    threads_without_slot: int
    invalid_codes: int
    restored: bool
    replaced: bool

@final
class StackSampler:
    """Bounded in-process stack samples of Python threads."""

    def __init__(
        self,
        max_samples: int,
        max_depth: int,
        thread_ids: Sequence[int] | None = None,
        idle_share: float = 0.2,
        idle_window_ns: int = 1_000_000,
    ) -> None: ...
    def sample(self) -> int:
        """Sample every wanted thread but the caller once; how many samples were recorded."""
    def export(self) -> _SamplerExport:
        """Everything recorded so far."""
    def count(self) -> int:
        """Samples recorded so far."""
    def forget_before(self, ts_ns: int, /) -> int:
        """Drop the longest run of oldest samples taken before ``ts_ns``; how many."""
    def interned(self) -> tuple[int, int, int]:
        """(code objects, frames, stack nodes) interned so far."""
    def start_signals(self, rate_hz: float, seed: int = 0, /) -> None:
        """Sample busy threads from a SIGPROF handler (RuntimeError saying why it cannot)."""
    def drain(self) -> int:
        """Move the signal samples recorded so far into the columns; how many."""
    def stop_signals(self, timeout_s: float = 1.0, /) -> _SignalStats:
        """Stop signal sampling, drain, restore SIGPROF; the run's counters."""

@final
class StepRing:
    """Every step's start and end (monotonic ns) and kind, the last ``capacity`` kept; with
    ``phases``, each step's phase times and CPU ns too."""

    def __init__(self, capacity: int, phases: bool = False) -> None: ...
    def begin(self, kind: int, /) -> None:
        """A step starts now (kind 0 unrecorded, 1 warmup, 2 and more recorded)."""
    def end(self) -> None:
        """The open step ends now (none open: nothing)."""
    def enter(self, phase: int, /) -> None:
        """Phase 0 data wait, 1 optimizer, 2 GC, 3 collective begins (nested: counted once)."""
    def leave(self, phase: int, /) -> None:
        """The phase entered last ends now."""
    def take(
        self, since: int, /
    ) -> tuple[int, int, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes]:
        """(first, count, starts, ends, kinds, data, optimizer, gc, collective, cpu) of steps
        first..count-1."""
    def settle(self) -> None:
        """Read the CPU clock now: every ended step's CPU time is then settled."""
    def export(self) -> tuple[bytes, bytes, bytes, int]:
        """(starts, ends, kinds, count): int64 and uint8 columns of the ring, steps ended."""

def _sampler_after_fork_in_child() -> None:
    """Forget a signal-sampling run inherited from the parent (in a forked child)."""

# -- the allocation hook (alloc_hook.c) ---------------------------------------------------------

class _AllocStep(TypedDict):
    current: int
    peak: int
    allocated: int
    freed: int
    allocs: int
    frees: int
    peak_mark: int

class _AllocStats(TypedDict):
    own_bytes: int
    live_blocks: int
    untracked: int
    dropped: int
    lost_frees: int
    samples: int
    passthrough_layers: int
    buffered: int

def _alloc_hook_start(mean_bytes: float, large_bytes: int, max_events: int, seed: int, /) -> None:
    """Hook the MEM and OBJ domains: exact totals, allocations sampled by bytes."""

def _alloc_hook_stop() -> bool:
    """Unhook; True when the originals were restored, False when left as a pass-through."""

def _alloc_hook_end_step() -> _AllocStep:
    """The closing step's exact counters; the next step starts from the current bytes."""

def _alloc_hook_poll() -> tuple[int, int]:
    """(current, highest since the last poll)."""

def _alloc_hook_drain() -> tuple[
    int, list[tuple[int, int, float, int, tuple[tuple[CodeType, int], ...]]]
]:
    """(first sequence number, [(ptr, size, weight, t_ns, frames)]), size 0 for a free."""

def _alloc_hook_stats() -> _AllocStats:
    """The hook's own memory, drops and samples."""

def _alloc_hook_numpy(api: object, /) -> bool:
    """Count numpy's default data allocations too (its _ARRAY_API capsule)."""

def _alloc_hook_pause(on: object, /) -> None:
    """Stop (True) or resume (False) counting this thread's allocations (nests)."""
