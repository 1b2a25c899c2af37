"""``key_averages()``: spans grouped as torch's ``key_averages`` groups events.

Rows carry torch's ``FunctionEventAvg`` attributes in torch's units (µs), and the same times in
ns under ``*_ns`` names.  Sort keys follow torch.profiler's table; ``cuda``, ``xpu`` and
``device`` spellings are accepted.  Self time = duration minus the time of nested spans on the
same thread.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepscope.analysis.sampled_time import sampled_time
from stepscope.profiler.events import (
    MEMORY_EVENT,
    PYTHON_CATEGORY,
    SKIPPED_CATEGORIES,
    USER_CATEGORIES,
    USER_SCOPE,
    FunctionEvent,
    TorchTimeNames,
    _device_name,
    device_type,
    flops_of,
    function_events,
    span_memory,
    split_overload,
)
from stepscope.profiler.sort_keys import SORT_KEYS
from stepscope.trace.model import Trace
from stepscope.trace.nesting import DEVICE_CATEGORIES, Nesting, group_name, nest_spans

__all__ = ["KeyAverages", "RowAverage", "key_averages"]


@dataclass
class RowAverage(TorchTimeNames):
    """One group of spans with torch's ``FunctionEventAvg`` attributes (times in µs).

    The ``*_ns`` fields hold the same times in nanoseconds, as recorded.
    """

    key: str
    count: int = 0
    cpu_time_total_ns: int = 0
    self_cpu_time_total_ns: int = 0
    device_time_total_ns: int = 0
    self_device_time_total_ns: int = 0
    input_shapes: Any = ""
    """The shapes of the group (a list) with ``group_by_input_shape``, else ``""`` (as torch)."""
    stack: list[str] = field(default_factory=list)
    overload_name: str = ""
    sampled: bool = False
    """Times estimated from stack samples; ``count`` is then the number of samples."""
    flops: int = 0
    cpu_memory_usage: int = 0
    self_cpu_memory_usage: int = 0
    device_memory_usage: int = 0
    self_device_memory_usage: int = 0
    is_user_annotation: bool = False
    on_device: bool = False
    """The spans ran on a device (kernels, memcpys), not on a CPU thread."""
    use_device: str | None = None
    node_id: int = -1
    scope: int = 0
    is_async: bool = False
    is_remote: bool = False
    is_legacy: bool = False
    _first: tuple[int, int] | None = field(default=None, repr=False, compare=False)
    _owner: KeyAverages | None = field(default=None, repr=False, compare=False)

    @property
    def device_type(self) -> Any:
        """torch's ``DeviceType`` of the group (stepscope's before torch is imported)."""
        return device_type(_device_name(self.use_device) if self.on_device else "CPU")

    @property
    def cpu_time_total(self) -> float:
        """Total CPU time (µs)."""
        return self.cpu_time_total_ns / 1000.0

    @property
    def self_cpu_time_total(self) -> float:
        """Total self CPU time (µs)."""
        return self.self_cpu_time_total_ns / 1000.0

    @property
    def device_time_total(self) -> float:
        """Total device time (µs)."""
        return self.device_time_total_ns / 1000.0

    @property
    def self_device_time_total(self) -> float:
        """Total self device time (µs)."""
        return self.self_device_time_total_ns / 1000.0

    @property
    def cpu_time_ns(self) -> float:
        """Average CPU time per call (ns)."""
        return self.cpu_time_total_ns / self.count if self.count else 0.0

    @property
    def device_time_ns(self) -> float:
        """Average device time per call (ns)."""
        return self.device_time_total_ns / self.count if self.count else 0.0

    @property
    def cpu_parent(self) -> FunctionEvent | None:
        """The CPU parent of the group's first event (as torch's rows keep it)."""
        first = self._first_event()
        return first.cpu_parent if first is not None else None

    @property
    def cpu_children(self) -> list[FunctionEvent]:
        """The CPU children of the group's first event."""
        first = self._first_event()
        return first.cpu_children if first is not None else []

    def _first_event(self) -> FunctionEvent | None:
        if self._owner is None or self._first is None:
            return None
        return self._owner._event_at(self._first)

    def add(self, other: RowAverage) -> RowAverage:
        """Add another row's totals to this one (torch's ``FunctionEventAvg.add``)."""
        self.count += other.count
        self.cpu_time_total_ns += other.cpu_time_total_ns
        self.self_cpu_time_total_ns += other.self_cpu_time_total_ns
        self.device_time_total_ns += other.device_time_total_ns
        self.self_device_time_total_ns += other.self_device_time_total_ns
        self.flops += other.flops
        self.cpu_memory_usage += other.cpu_memory_usage
        self.self_cpu_memory_usage += other.self_cpu_memory_usage
        self.device_memory_usage += other.device_memory_usage
        self.self_device_memory_usage += other.self_device_memory_usage
        return self

    __iadd__ = add

    def __repr__(self) -> str:
        return (
            f"<FunctionEventAvg key={self.key} self_cpu_time={self.self_cpu_time_total_str} "
            f"cpu_time={self.cpu_time_str} count={self.count} "
            f"input_shapes={self.input_shapes} sampled={self.sampled}>"
        )


class KeyAverages:
    """Grouped rows with ``table()`` for people and ``to_rows()`` for programs."""

    def __init__(
        self,
        rows: list[RowAverage],
        *,
        by_shape: bool,
        by_stack: bool,
        notes: list[str] | None = None,
        traces: Sequence[Trace] = (),
        use_device: str | None = None,
        profile_memory: bool = False,
        with_flops: bool = False,
    ) -> None:
        self.rows = rows
        self.by_shape = by_shape
        """Rows are grouped by input shapes too (the table shows them)."""
        self.by_stack = by_stack
        """Rows are grouped by enclosing Python frames too (the table shows them)."""
        self.notes = notes or []
        """What a reader of the table must know (calls dropped, rows estimated from samples)."""
        self.use_device = use_device
        self.profile_memory = profile_memory
        """The table shows memory columns (as torch's with ``profile_memory=True``)."""
        self.with_flops = with_flops
        """The table shows a FLOPs column (as torch's with ``with_flops=True``)."""
        self._traces = list(traces)
        self._events: dict[tuple[int, int], FunctionEvent] | None = None
        for row in rows:
            row._owner = self

    def _event_at(self, where: tuple[int, int]) -> FunctionEvent | None:
        if self._events is None:
            self._events = {}
            for t, trace in enumerate(self._traces):
                for ev in function_events([trace], use_device=self.use_device):
                    if ev.span_index >= 0:
                        self._events[(t, ev.span_index)] = ev
        return self._events.get(where)

    def __iter__(self) -> Iterator[RowAverage]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> RowAverage:
        return self.rows[index]

    @property
    def self_cpu_time_total(self) -> float:
        """Sum of the rows' self CPU time (µs)."""
        return sum(r.self_cpu_time_total_ns for r in self.rows) / 1000.0

    def total_average(self) -> RowAverage:
        """Every row summed into one, keyed ``Total`` (torch's ``total_average``)."""
        total = RowAverage("Total", use_device=self.use_device)
        for row in self.rows:
            total.add(row)
        return total

    def sorted_rows(self, sort_by: str | None) -> list[RowAverage]:
        """Rows sorted descending by a torch sort key (None keeps first-seen order)."""
        if sort_by is None:
            return list(self.rows)
        attr = SORT_KEYS.get(sort_by)
        if attr is None:
            valid = ", ".join(sorted(SORT_KEYS))
            raise ValueError(f"unknown sort_by {sort_by!r}; valid keys: {valid}")
        return sorted(self.rows, key=lambda r: getattr(r, attr), reverse=True)

    def table(
        self,
        sort_by: str | None = None,
        row_limit: int = 100,
        max_src_column_width: int = 75,
        max_name_column_width: int = 55,
        max_shapes_column_width: int = 80,
        header: str | None = None,
        top_level_events_only: bool = False,
        time_unit: str | None = None,
    ) -> str:
        """The rows as torch.profiler's text table (``time_unit``: None, "s", "ms" or "us")."""
        from stepscope.report.table import key_averages_table

        return key_averages_table(
            self,
            sort_by=sort_by,
            row_limit=row_limit,
            max_src_column_width=max_src_column_width,
            max_name_column_width=max_name_column_width,
            max_shapes_column_width=max_shapes_column_width,
            header=header,
            top_level_events_only=top_level_events_only,
            time_unit=time_unit,
        )

    def __str__(self) -> str:
        return self.table()

    def to_rows(self, sort_by: str | None = None) -> list[dict[str, Any]]:
        """Rows as plain dicts (times in ns) for programs."""
        return [
            {
                "name": r.key,
                "count": r.count,
                "self_cpu_time_total_ns": r.self_cpu_time_total_ns,
                "cpu_time_total_ns": r.cpu_time_total_ns,
                "cpu_time_avg_ns": r.cpu_time_ns,
                "self_device_time_total_ns": r.self_device_time_total_ns,
                "device_time_total_ns": r.device_time_total_ns,
                "device_time_avg_ns": r.device_time_ns,
                "input_shapes": r.input_shapes,
                "stack": list(r.stack),
                "sampled": r.sampled,
                "flops": r.flops,
                "cpu_memory_usage": r.cpu_memory_usage,
                "self_cpu_memory_usage": r.self_cpu_memory_usage,
            }
            for r in self.sorted_rows(sort_by)
        ]


def _input_shapes(args: Any) -> list[Any]:
    """torch's ``input_shapes``: one shape per input, ``[]`` for lists of tensors and scalars."""
    dims = args.get("Input Dims") if args else None
    if not isinstance(dims, list):
        return []
    return [d if isinstance(d, list) and all(isinstance(x, int) for x in d) else [] for d in dims]


GroupKey = tuple[str, bool, bool, str, str, tuple[str, ...]]


def key_averages(
    traces: Iterable[Trace],
    group_by_input_shape: bool = False,
    group_by_stack_n: int = 0,
    group_by_overload_name: bool = False,
    *,
    use_device: str | None = None,
    profile_memory: bool = False,
    with_flops: bool = False,
    overload_names: bool = False,
) -> KeyAverages:
    """Group the spans of ``traces`` by name (plus shapes / stack frames / overload when asked).

    As torch, groups are also apart by device (CPU or not) and by being a user annotation.
    """
    if isinstance(group_by_stack_n, bool) or not isinstance(group_by_stack_n, int):
        raise TypeError(f"group_by_stack_n must be an int, got {group_by_stack_n!r}")
    if group_by_stack_n < 0:
        raise ValueError(f"group_by_stack_n must be zero or more, got {group_by_stack_n}")
    traces = list(traces)
    groups: dict[GroupKey, RowAverage] = {}
    notes: list[str] = []
    for t, trace in enumerate(traces):
        nesting = nest_spans(trace)
        spans = trace.spans
        names, cats = spans["name"], spans["cat"]
        durs, argrefs = spans["dur_ns"], spans["args"]
        strings = trace.strings
        self_ns = nesting.self_ns
        python_spans = PYTHON_CATEGORY in strings and any(
            strings[c] == PYTHON_CATEGORY for c in set(cats)
        )
        if len(trace.samples) and not python_spans:
            self_ns = array("q", self_ns)
            _add_sampled_rows(trace, self_ns, groups, notes, use_device)
        notes += _tracer_notes(trace)
        on_device = [strings[c] in DEVICE_CATEGORIES for c in cats]
        if use_device is None and any(on_device):
            use_device = "cuda"
        dev_total, dev_self = _device_times(trace, nesting, on_device)
        mem_cpu, mem_dev, unmatched = span_memory(trace, nesting)
        if profile_memory:
            _add_memory_rows(trace, unmatched, groups, use_device)
        flops_by_id = flops_of(trace)
        need_args = group_by_input_shape or bool(flops_by_id)  # args are parsed on demand
        self_mem_cpu, self_mem_dev = list(mem_cpu), list(mem_dev)
        for i in range(len(spans)):
            p = nesting.parent[i]
            if p >= 0 and not on_device[i]:
                self_mem_cpu[p] -= mem_cpu[i]
                self_mem_dev[p] -= mem_dev[i]
        for i in range(len(spans)):
            cat = strings[cats[i]]
            if cat in SKIPPED_CATEGORIES:
                continue
            name = group_name(strings[names[i]])
            overload = ""
            if overload_names and cat == "cpu_op":
                name, overload = split_overload(name)
            if not group_by_overload_name:
                overload = ""
            args = trace.args_at(argrefs[i]) if need_args and argrefs[i] >= 0 else None
            shapes = _input_shapes(args) if group_by_input_shape else ""
            stack: tuple[str, ...] = ()
            if group_by_stack_n:
                frames = [
                    strings[names[a]]
                    for a in nesting.ancestors(i)
                    if strings[cats[a]] == PYTHON_CATEGORY
                ]
                stack = tuple(frames[:group_by_stack_n])
            user = cat in USER_CATEGORIES
            key = (name, on_device[i], user, str(shapes), overload, stack)
            row = groups.get(key)
            if row is None:
                row = groups[key] = RowAverage(
                    name,
                    input_shapes=shapes,
                    stack=list(stack),
                    overload_name=overload,
                    is_user_annotation=user,
                    on_device=on_device[i],
                    use_device=use_device,
                    scope=USER_SCOPE if user else 0,
                    _first=(t, i),
                )
            folded = nesting.folded[i]  # counted within its same-named parent
            if not folded:
                row.count += 1
            ext = args.get("External id") if args and not on_device[i] else None
            if ext is not None and str(ext) in flops_by_id:
                row.flops += flops_by_id[str(ext)]
            row.cpu_memory_usage += 0 if folded else mem_cpu[i]
            row.device_memory_usage += 0 if folded else mem_dev[i]
            if on_device[i]:
                row.device_time_total_ns += 0 if folded else durs[i]
                row.self_device_time_total_ns += self_ns[i]
            else:
                row.cpu_time_total_ns += 0 if folded else durs[i]
                row.self_cpu_time_total_ns += self_ns[i]
                row.device_time_total_ns += 0 if folded else dev_total[i]
                row.self_device_time_total_ns += dev_self[i]
                row.self_cpu_memory_usage += self_mem_cpu[i]
                row.self_device_memory_usage += self_mem_dev[i]
    for row in groups.values():
        row.use_device = use_device
    return KeyAverages(
        list(groups.values()),
        by_shape=group_by_input_shape,
        by_stack=group_by_stack_n > 0,
        notes=list(dict.fromkeys(notes)),
        traces=traces,
        use_device=use_device,
        profile_memory=profile_memory,
        with_flops=with_flops,
    )


def _add_memory_rows(
    trace: Trace,
    indices: list[int],
    groups: dict[GroupKey, RowAverage],
    use_device: str | None,
) -> None:
    """The ``[memory]`` row: allocations outside every op, as torch lists them."""
    args_col = trace.instants["args"]
    for j in indices:
        key = (MEMORY_EVENT, False, False, "", "", ())
        row = groups.get(key)
        if row is None:
            row = groups[key] = RowAverage(MEMORY_EVENT, use_device=use_device)
        args = trace.args_at(args_col[j]) or {}
        nbytes = int(args.get("Bytes", 0) or 0)
        row.count += 1
        if args.get("Device Type", 0) == 0:
            row.cpu_memory_usage += nbytes
            row.self_cpu_memory_usage += nbytes
        else:
            row.device_memory_usage += nbytes
            row.self_device_memory_usage += nbytes


def _device_times(
    trace: Trace, nesting: Nesting, on_device: list[bool]
) -> tuple[list[int], list[int]]:
    """Kernel time of each CPU span: its own launches (self) and with nested spans' (total).

    A kernel belongs to the CPU op whose ``External id`` it carries, as in torch's event tree.
    """
    n = len(on_device)
    own = [0] * n
    if not any(on_device):
        return own, own
    spans = trace.spans
    strings = trace.strings
    by_external: dict[int, int] = {}
    kernels: list[tuple[int, int]] = []
    for i in range(n):
        args = trace.args_at(spans["args"][i]) if spans["args"][i] >= 0 else None
        ext = args.get("External id") if args else None
        if not isinstance(ext, int):
            continue
        if not on_device[i]:
            by_external.setdefault(ext, i)
        elif strings[spans["cat"][i]] == "kernel":
            kernels.append((ext, spans["dur_ns"][i]))
    for ext, dur in kernels:
        op = by_external.get(ext)
        if op is not None:
            own[op] += dur
    total = list(own)
    for i in range(n):
        if own[i]:
            for a in nesting.ancestors(i):
                total[a] += own[i]
    return total, own


def _add_sampled_rows(
    trace: Trace,
    self_ns: array[int],
    groups: dict[GroupKey, RowAverage],
    notes: list[str],
    use_device: str | None,
) -> None:
    """Rows of sampled Python functions; the spans they ran in give up that self time."""
    found = sampled_time(trace, self_ns)
    for span, taken in found.taken_from_spans.items():
        self_ns[span] -= taken
    for name, function in found.functions.items():
        key = (name, False, False, "", "", ())
        row = groups.get(key)
        if row is None:
            row = groups[key] = RowAverage(name, sampled=True, use_device=use_device)
        row.count += function.samples
        row.self_cpu_time_total_ns += round(function.self_ns)
        row.cpu_time_total_ns += round(function.total_ns)
    if found.samples_used:
        notes.append(
            "~N in # of Calls: a Python function seen in N stack samples; its times are "
            "estimated from the samples and taken out of the step's own time"
        )
    if found.samples_in_ops:
        notes.append(
            f"{found.samples_in_ops} samples fell inside operators and count as the operators' time"
        )


def _tracer_notes(trace: Trace) -> list[str]:
    """What the function tracer left out of this window."""
    info = trace.metadata.get("stepscope_python_tracer")
    if not isinstance(info, dict) or not info.get("dropped_events"):
        return []
    return [
        f"the function tracer dropped {info['dropped_events']} calls over its budget of "
        f"{info.get('event_budget')} ({info.get('drop_policy')} dropped): their time shows as "
        "self time of the frames that called them; raise the budget (event_budget, or "
        "--max-calls) or narrow the tracer (include/exclude/max_depth)"
    ]
