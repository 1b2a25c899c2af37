"""``events()``: the window's spans as torch's ``FunctionEvent`` objects (times in µs).

Attribute names, units and meanings follow ``torch.autograd.profiler_util.FunctionEvent``:
``time_range`` is an :class:`Interval` in µs from the start of the first recorded window,
``cpu_time_total`` and friends are µs, ``input_shapes`` / ``concrete_inputs`` / ``kwinputs``
come from the op's recorded arguments, ``cpu_parent`` / ``cpu_children`` from the nesting of
spans on each thread, and ``device_type`` is torch's ``DeviceType`` once the program has
imported torch (stepscope's :class:`DeviceType` otherwise).  Each event also keeps stepscope's
own view of the span (``cat``, ``args``, ``pid``, ``tid``, ``start_ns``, ``dur_ns``).
"""

from __future__ import annotations

import ast
import bisect
import enum
import logging
import sys
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from stepscope.jsonenc import json_bytes
from stepscope.trace.model import Trace
from stepscope.trace.nesting import DEVICE_CATEGORIES, Nesting, group_name, nest_spans
from stepscope.trace.raw_args import arg_rows
from stepscope.trace.worker_tracks import WORKER_CATEGORY

if TYPE_CHECKING:
    from stepscope.profiler.summary import KeyAverages, RowAverage

log = logging.getLogger("stepscope")
torch_log = logging.getLogger("torch.autograd.profiler")
"""Where torch logs its post-processing timeout: programs watching it see stepscope's too."""

__all__ = [
    "DeviceType",
    "EventList",
    "FunctionEvent",
    "Interval",
    "Kernel",
    "device_type",
    "flops_of",
    "format_time",
    "function_events",
    "span_memory",
    "split_overload",
]

PYTHON_CATEGORY = "python_function"
SKIPPED_CATEGORIES = frozenset({"Trace", WORKER_CATEGORY})  # Kineto's session; worker processes
USER_CATEGORIES = frozenset({"user_annotation", "gpu_user_annotation"})
USER_SCOPE = 7  # torch's at::RecordScope::USER_SCOPE
MEMORY_EVENT = "[memory]"
FLOPS_KEY = "stepscope_flops"
KINETO_ARG_KEYS = frozenset(
    {
        "External id",
        "Record function id",
        "Sequence number",
        "Fwd thread id",
        "Ev Idx",
        "Input Dims",
        "Input type",
        "Input Strides",
        "Concrete Inputs",
        "Call stack",
        "Module Hierarchy",
        "flops",
        "Python id",
        "Python parent id",
        "Python module id",
        "Python thread",
        "Overload name",
        "correlation",
        "kernel_backend",
    }
)
"""Arguments torch writes for every op: what is left are the op's keyword inputs."""
ARGS_STRING = "args"
"""Where a stepscope annotation keeps ``record_function``'s args string (not a keyword input)."""


class DeviceType(enum.Enum):
    """Where an event ran (the members of torch's ``DeviceType`` that stepscope records)."""

    CPU = 0
    CUDA = 1
    XPU = 12
    MTIA = 19
    HPU = 14
    PrivateUse1 = 20


def device_type(name: str) -> Any:
    """torch's ``DeviceType.<name>`` once torch is imported, else stepscope's ``DeviceType``."""
    torch = sys.modules.get("torch")
    torch_types = getattr(getattr(torch, "autograd", None), "DeviceType", None)
    if torch_types is not None and hasattr(torch_types, name):
        return getattr(torch_types, name)
    return DeviceType[name]


def format_time(time_us: float) -> str:
    """A µs duration as torch prints it (``1.234ms``)."""
    if time_us >= 1e6:
        return f"{time_us / 1e6:.3f}s"
    if time_us >= 1e3:
        return f"{time_us / 1e3:.3f}ms"
    return f"{time_us:.3f}us"


class Interval:
    """A start and end time in µs."""

    __slots__ = ("end", "start")

    def __init__(self, start: float, end: float) -> None:
        self.start = start
        self.end = end

    def elapsed_us(self) -> float:
        """The length of the interval (µs)."""
        return self.end - self.start

    def __repr__(self) -> str:
        return f"Interval(start={self.start}, end={self.end})"


class Kernel(NamedTuple):
    """A device kernel launched by a CPU event: name, device index and duration (µs)."""

    name: str
    device: int
    duration: float


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"`{old}` is deprecated, please use `{new}` instead.", FutureWarning, stacklevel=3
    )


class TorchTimeNames:
    """Per-call averages, torch's deprecated ``cuda_*`` spellings (they warn, as torch's do) and
    its ``*_str`` formatted times, shared by events and key_averages rows."""

    if TYPE_CHECKING:  # what the class using this provides (attributes or properties)
        count: int

        @property
        def cpu_time_total(self) -> float: ...
        @property
        def self_cpu_time_total(self) -> float: ...
        @property
        def device_time_total(self) -> float: ...
        @property
        def self_device_time_total(self) -> float: ...

    @property
    def cpu_time(self) -> float:
        """Average CPU time per call (µs)."""
        return self.cpu_time_total / self.count if self.count else 0.0

    @property
    def device_time(self) -> float:
        """Average device time per call (µs)."""
        return self.device_time_total / self.count if self.count else 0.0

    @property
    def cuda_time(self) -> float:
        """Deprecated: ``device_time``."""
        _deprecated("cuda_time", "device_time")
        return self.device_time

    @property
    def cuda_time_total(self) -> float:
        """Deprecated: ``device_time_total``."""
        _deprecated("cuda_time_total", "device_time_total")
        return self.device_time_total

    @property
    def self_cuda_time_total(self) -> float:
        """Deprecated: ``self_device_time_total``."""
        _deprecated("self_cuda_time_total", "self_device_time_total")
        return self.self_device_time_total

    @property
    def cpu_time_str(self) -> str:
        """``cpu_time`` formatted as torch does."""
        return format_time(self.cpu_time)

    @property
    def cpu_time_total_str(self) -> str:
        """``cpu_time_total`` formatted as torch does."""
        return format_time(self.cpu_time_total)

    @property
    def self_cpu_time_total_str(self) -> str:
        """``self_cpu_time_total`` formatted as torch does."""
        return format_time(self.self_cpu_time_total)

    @property
    def device_time_str(self) -> str:
        """``device_time`` formatted as torch does."""
        return format_time(self.device_time)

    @property
    def device_time_total_str(self) -> str:
        """``device_time_total`` formatted as torch does."""
        return format_time(self.device_time_total)

    @property
    def self_device_time_total_str(self) -> str:
        """``self_device_time_total`` formatted as torch does."""
        return format_time(self.self_device_time_total)


class FunctionEvent(TorchTimeNames):
    """One recorded span with torch's ``FunctionEvent`` attributes (times in µs)."""

    def __init__(
        self,
        *,
        id: int,
        name: str,
        trace_name: str,
        cat: str,
        pid: int | str,
        tid: int | str,
        start_ns: int,
        dur_ns: int,
        origin_ns: int,
        args: Mapping[str, Any] | None,
        use_device: str | None,
    ) -> None:
        args = args or {}
        self.id = id
        self.name = name
        """The grouping name: ``ProfilerStep#N`` reads ``ProfilerStep*`` (as in torch)."""
        self.trace_name = trace_name
        """The name as recorded (``ProfilerStep#N``)."""
        self.cat = cat
        """The span's Chrome-trace category (``cpu_op``, ``user_annotation``, ``kernel``...)."""
        self.pid = pid
        self.tid = tid
        self.start_ns = start_ns
        """Start on stepscope's clock (ns)."""
        self.dur_ns = dur_ns
        """Duration (ns)."""
        self.args: Mapping[str, Any] | None = args or None
        """The span's arguments as recorded in the trace."""
        start_us = (start_ns - origin_ns) / 1000.0
        self.time_range = Interval(start_us, start_us + dur_ns / 1000.0)
        self.thread = tid
        self.fwd_thread: int | None = args.get("Fwd thread id")
        self.node_id = -1
        self.count = 1
        self.kernels: list[Kernel] = []
        self.cpu_children: list[FunctionEvent] = []
        self.cpu_parent: FunctionEvent | None = None
        dims = args.get("Input Dims")
        self.structured_input_shapes: list[Any] = list(dims) if isinstance(dims, list) else []
        self.input_shapes: list[Any] = [
            d if isinstance(d, list) and all(isinstance(x, int) for x in d) else []
            for d in self.structured_input_shapes
        ]
        strides = args.get("Input Strides")
        self.structured_input_strides: list[Any] = (
            list(strides) if isinstance(strides, list) else []
        )
        types = args.get("Input type")
        self.input_dtypes: list[str] = list(types) if isinstance(types, list) else []
        concrete = args.get("Concrete Inputs")
        if not isinstance(concrete, list) and isinstance(types, list):
            concrete = [""] * len(types)  # a merged trace drops an all-empty list
        self.concrete_inputs: list[Any] = (
            [_concrete(v) for v in concrete] if isinstance(concrete, list) else []
        )
        # record_function's args string is the block's input (torch's), not a keyword input
        text_input = cat in USER_CATEGORIES and isinstance(args.get(ARGS_STRING), str)
        self.kwinputs: dict[str, Any] = (
            {
                k: v
                for k, v in args.items()
                if k not in KINETO_ARG_KEYS
                and not k.startswith("stepscope")
                and not (text_input and k == ARGS_STRING)
            }
            if cat not in DEVICE_CATEGORIES
            else {}
        )
        overload = args.get("Overload name")
        self.overload_name: str = overload if isinstance(overload, str) else ""
        self.stack: list[str] = []
        self.is_user_annotation = cat in USER_CATEGORIES
        self.scope = USER_SCOPE if self.is_user_annotation else 0
        self.use_device = use_device
        self.cpu_memory_usage = 0
        self.device_memory_usage = 0
        self.is_async = False
        self.is_remote = False
        self.is_legacy = False
        self.is_python_function = cat == PYTHON_CATEGORY
        self.activity_type = cat
        seq = args.get("Sequence number")
        self.sequence_nr: int = seq if isinstance(seq, int) else -1
        on_device = cat in DEVICE_CATEGORIES
        self.device_type: Any = device_type(_device_name(use_device) if on_device else "CPU")
        device = args.get("device")
        self.device_index: int = device if on_device and isinstance(device, int) else 0
        stream = args.get("stream")
        self.device_resource_id: Any = stream if on_device and isinstance(stream, int) else tid
        flops = args.get("flops")
        self.flops: int | None = flops if isinstance(flops, int) else None
        ext = args.get("External id")
        self.external_id: int = ext if isinstance(ext, int) else 0
        self.self_cpu_percent: Any = -1
        self.total_cpu_percent: Any = -1
        self.total_device_percent: Any = -1
        self._self_ns = dur_ns
        self.span_index = -1
        """The span's row in its window's ``Trace`` (-1 for ``[memory]`` events)."""
        self.event_metadata: Any = None
        """torch's structured collective metadata (stepscope keeps it in ``args``)."""

    @property
    def metadata_json(self) -> str:
        """Deprecated (as in torch): the event's args as JSON members, as Kineto writes them."""
        warnings.warn(
            "`metadata_json` is deprecated. Use `event_metadata` instead.",
            FutureWarning,
            stacklevel=2,
        )
        if not self.args:
            return ""
        return json_bytes(dict(self.args)).decode()[1:-1]

    # -- times (µs), as torch computes them ------------------------------------------------
    @property
    def _on_cpu(self) -> bool:
        return self.cat not in DEVICE_CATEGORIES

    @property
    def cpu_time_total(self) -> float:
        """Duration on the CPU (µs); 0 for device events."""
        return self.dur_ns / 1000.0 if self._on_cpu else 0

    @property
    def self_cpu_time_total(self) -> float:
        """CPU time minus the CPU time of the events nested in it (µs)."""
        return self._self_ns / 1000.0 if self._on_cpu else 0

    @property
    def device_time_total(self) -> float:
        """Device time (µs): own kernels and those of nested events, or the device span's."""
        if not self.use_device:
            return 0
        if self._on_cpu:
            return sum(k.duration for k in self.kernels) + sum(
                c.device_time_total for c in self.cpu_children
            )
        return self.dur_ns / 1000.0

    @property
    def self_device_time_total(self) -> float:
        """Device time of this event's own kernels (µs)."""
        if not self.use_device:
            return 0
        if self._on_cpu:
            return self.device_time_total - sum(c.device_time_total for c in self.cpu_children)
        return self.device_time_total

    @property
    def self_cpu_memory_usage(self) -> int:
        """Bytes allocated on the CPU in this event minus in its children."""
        if not self._on_cpu:
            return 0
        return self.cpu_memory_usage - sum(c.cpu_memory_usage for c in self.cpu_children)

    @property
    def self_device_memory_usage(self) -> int:
        """Bytes allocated on the device in this event minus in its children."""
        if not self._on_cpu:
            return 0
        return self.device_memory_usage - sum(c.device_memory_usage for c in self.cpu_children)

    @property
    def key(self) -> str:
        """The grouping key (the name)."""
        return self.name

    @property
    def end_ns(self) -> int:
        """End on stepscope's clock (ns)."""
        return self.start_ns + self.dur_ns

    @property
    def self_cuda_memory_usage(self) -> int:
        """Deprecated: ``self_device_memory_usage``."""
        _deprecated("self_cuda_memory_usage", "self_device_memory_usage")
        return self.self_device_memory_usage

    def __repr__(self) -> str:
        return (
            f"<FunctionEvent id={self.id} name={self.name} device_type={self.device_type} "
            f"cpu_time={self.cpu_time_str} start_us={self.time_range.start} "
            f"end_us={self.time_range.end} cpu_children={[c.id for c in self.cpu_children]} "
            f"thread={self.thread} input_shapes={self.input_shapes}>"
        )


class EventList(list[FunctionEvent]):
    """The events of the recorded window(s), with torch's ``EventList`` methods."""

    def __init__(
        self,
        events: Iterable[FunctionEvent] = (),
        *,
        traces: Sequence[Trace] = (),
        use_device: str | None = None,
        profile_memory: bool = False,
        with_flops: bool = False,
        overload_names: bool = False,
    ) -> None:
        super().__init__(events)
        self._overload_names = overload_names
        self._traces = list(traces)
        self._use_device = use_device
        self._profile_memory = profile_memory
        self._with_flops = with_flops

    @property
    def self_cpu_time_total(self) -> float:
        """Sum of the events' self CPU time (µs)."""
        return sum(e.self_cpu_time_total for e in self)

    def key_averages(
        self,
        group_by_input_shapes: bool = False,
        group_by_stack_n: int = 0,
        group_by_overload_name: bool = False,
    ) -> KeyAverages:
        """The events grouped by key (see ``profile.key_averages``)."""
        from stepscope.profiler.summary import key_averages

        return key_averages(
            self._traces,
            group_by_input_shape=group_by_input_shapes,
            group_by_stack_n=group_by_stack_n,
            group_by_overload_name=group_by_overload_name,
            use_device=self._use_device,
            profile_memory=self._profile_memory,
            with_flops=self._with_flops,
            overload_names=self._overload_names,
        )

    def total_average(self) -> RowAverage:
        """Every event summed into one row keyed ``Total``."""
        return self.key_averages().total_average()

    def table(self, **kwargs: Any) -> str:
        """The grouped events as torch's text table (``KeyAverages.table`` arguments)."""
        return self.key_averages().table(**kwargs)


def _device_name(use_device: str | None) -> str:
    names = {"cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA", "hpu": "HPU"}
    return names.get(use_device or "cuda", "PrivateUse1")


def split_overload(name: str) -> tuple[str, str]:
    """``aten::add.Tensor`` -> (``aten::add``, ``Tensor``); a name without one -> (name, "")."""
    head, dot, tail = name.rpartition(".")
    if dot and "::" in head and tail and "::" not in tail and " " not in name:
        return head, tail
    return name, ""


def _concrete(value: Any) -> Any:
    """A ``Concrete Inputs`` entry as torch returns it: '' -> None, literals parsed."""
    if not isinstance(value, str):
        return value
    if value == "":
        return None
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def span_memory(trace: Trace, nesting: Nesting) -> tuple[list[int], list[int], list[int]]:
    """Bytes allocated (CPU, device) during each span, and the ``[memory]`` instants in none.

    As torch: an allocation counts for every CPU span on its thread that contains it.
    """
    spans = trace.spans
    n = len(spans)
    cpu = [0] * n
    device = [0] * n
    strings = trace.strings
    records: dict[tuple[int, int], list[tuple[int, int, bool, int]]] = {}
    inst = trace.instants
    names = inst["name"]
    mem_id = trace.strings.index(MEMORY_EVENT) if MEMORY_EVENT in strings else -1
    if mem_id < 0:
        return cpu, device, []
    found = [j for j, name in enumerate(names) if name == mem_id]
    # each event's bytes and device type read from the args' text in one pass
    read = arg_rows([trace.args_at(inst["args"][j]) for j in found], ("Bytes", "Device Type"))
    for j, (nbytes, device_type) in zip(found, read, strict=True):
        key = (inst["pid"][j], inst["tid"][j])
        on_cpu = (device_type or 0) == 0
        records.setdefault(key, []).append((inst["ts_ns"][j], int(nbytes or 0), on_cpu, j))
    for recs in records.values():
        recs.sort()
    cats = spans["cat"]
    used: set[int] = set()
    for i in range(n):
        if strings[cats[i]] in DEVICE_CATEGORIES:
            continue
        track = records.get((spans["pid"][i], spans["tid"][i]))
        if not track:
            continue
        start = spans["start_ns"][i]
        end = start + spans["dur_ns"][i]
        lo = bisect.bisect_left(track, (start, -(2**62), False, -1))
        for ts, nbytes, on_cpu, j in track[lo:]:
            if ts > end:
                break
            used.add(j)
            if on_cpu:
                cpu[i] += nbytes
            else:
                device[i] += nbytes
    unmatched = [j for recs in records.values() for *_, j in recs if j not in used]
    return cpu, device, sorted(unmatched)


def flops_of(trace: Trace) -> dict[str, int]:
    """``{External id: FLOPs}`` torch counted for the window's ops (``with_flops=True``)."""
    found = trace.metadata.get(FLOPS_KEY)
    return found if isinstance(found, dict) else {}


def window_origin_ns(traces: Sequence[Trace]) -> int:
    """Where ``time_range`` counts from: the first window's start."""
    for trace in traces:
        window = trace.metadata.get("stepscope_window")
        if isinstance(window, dict) and isinstance(window.get("start_ns"), int):
            return int(window["start_ns"])
    starts = [min(t.spans["start_ns"]) for t in traces if len(t.spans)]
    return min(starts) if starts else 0


def function_events(
    traces: Sequence[Trace],
    *,
    use_device: str | None = None,
    profile_memory: bool = False,
    with_flops: bool = False,
    timeout_s: float | None = None,
    overload_names: bool = False,
) -> EventList:
    """The spans of ``traces`` as :class:`FunctionEvent` objects, linked as torch links them.

    ``timeout_s``: stop making events after that long and return those made (logged), as
    torch's ``post_processing_timeout_s``.  ``overload_names``: op names carry their overload
    (``aten::add.Tensor``, torch's ``capture_overload_names``) and are split into ``name`` and
    ``overload_name``.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    origin = window_origin_ns(traces)
    out: list[FunctionEvent] = []
    next_id = 1 + max(
        (
            a.get("External id", 0)
            for t in traces
            for a in (t.args_at(r) for r in t.spans["args"])
            if a and isinstance(a.get("External id"), int)
        ),
        default=0,
    )
    timed_out = False
    for trace in traces:
        nesting = nest_spans(trace)
        spans = trace.spans
        strings = trace.strings
        cpu_mem, dev_mem, unmatched = span_memory(trace, nesting)
        flops_by_id = flops_of(trace)
        by_index: dict[int, FunctionEvent] = {}
        by_external: dict[int, FunctionEvent] = {}
        for i in range(len(spans)):
            if deadline is not None and time.monotonic() >= deadline:
                torch_log.warning(
                    "stepscope: events() timed out after %.3f seconds "
                    "(post_processing_timeout_s), returning partial results with %d events",
                    timeout_s,
                    len(out),
                )
                timed_out = True
                break
            cat = strings[spans["cat"][i]]
            if cat in SKIPPED_CATEGORIES:
                continue
            raw = strings[spans["name"][i]]
            overload = ""
            if overload_names and cat == "cpu_op":
                raw, overload = split_overload(raw)
            args = trace.args_at(spans["args"][i])
            ext = args.get("External id") if args else None
            on_device = cat in DEVICE_CATEGORIES
            if isinstance(ext, int) and not on_device:
                event_id = ext
            else:
                event_id, next_id = next_id, next_id + 1
            ev = FunctionEvent(
                id=event_id,
                name=group_name(raw),
                trace_name=raw,
                cat=cat,
                pid=trace.label(spans["pid"][i]),
                tid=trace.label(spans["tid"][i]),
                start_ns=spans["start_ns"][i],
                dur_ns=spans["dur_ns"][i],
                origin_ns=origin,
                args=args,
                use_device=use_device,
            )
            ev._self_ns = nesting.self_ns[i]
            ev.span_index = i
            if overload:
                ev.overload_name = overload
            if isinstance(ext, int) and not on_device and str(ext) in flops_by_id:
                ev.flops = flops_by_id[str(ext)]
            ev.cpu_memory_usage = cpu_mem[i]
            ev.device_memory_usage = dev_mem[i]
            by_index[i] = ev
            if isinstance(ext, int) and not on_device:
                by_external.setdefault(ext, ev)
            out.append(ev)
        for i, ev in by_index.items():
            if ev.cat in DEVICE_CATEGORIES:
                launcher = by_external.get(ev.external_id)
                if launcher is not None and ev.cat == "kernel":
                    launcher.kernels.append(
                        Kernel(ev.name, ev.device_index, ev.time_range.elapsed_us())
                    )
                continue
            p = nesting.parent[i]
            parent = by_index.get(p) if p >= 0 else None
            if parent is not None and parent.cat not in DEVICE_CATEGORIES:
                ev.cpu_parent = parent
                parent.cpu_children.append(ev)
            ev.stack = [
                strings[spans["name"][a]]
                for a in nesting.ancestors(i)
                if strings[spans["cat"][a]] == PYTHON_CATEGORY
            ]
        if profile_memory and not timed_out:
            out += _memory_events(trace, unmatched, origin, use_device, next_id)
            next_id += len(unmatched)
        if timed_out:
            break
    out.sort(key=lambda e: (e.start_ns, -e.dur_ns))
    return EventList(
        out,
        traces=traces,
        use_device=use_device,
        profile_memory=profile_memory,
        with_flops=with_flops,
        overload_names=overload_names,
    )


def _memory_events(
    trace: Trace, indices: list[int], origin: int, use_device: str | None, first_id: int
) -> list[FunctionEvent]:
    """``[memory]`` events for allocations outside every op (torch lists those too)."""
    inst = trace.instants
    out = []
    for k, j in enumerate(indices):
        args = trace.args_at(inst["args"][j]) or {}
        ev = FunctionEvent(
            id=first_id + k,
            name=MEMORY_EVENT,
            trace_name=MEMORY_EVENT,
            cat="cpu_instant_event",
            pid=trace.label(inst["pid"][j]),
            tid=trace.label(inst["tid"][j]),
            start_ns=inst["ts_ns"][j],
            dur_ns=0,
            origin_ns=origin,
            args=None,
            use_device=use_device,
        )
        ev._self_ns = 0
        if args.get("Device Type", 0) == 0:
            ev.cpu_memory_usage = int(args.get("Bytes", 0) or 0)
        else:
            ev.device_memory_usage = int(args.get("Bytes", 0) or 0)
        out.append(ev)
    return out
