"""``key_averages()``: spans grouped by name (and optionally input shapes or call stack).

Column names and sort keys follow torch.profiler's table; both ``cuda`` and ``device`` spellings
are accepted.  Self time = duration minus the time of nested spans on the same thread.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from stepscope.analysis.sampled_time import sampled_time
from stepscope.trace.model import Trace
from stepscope.trace.nesting import DEVICE_CATEGORIES, group_name, nest_spans

__all__ = ["KeyAverages", "RowAverage", "key_averages"]

SKIPPED_CATEGORIES = frozenset({"Trace"})  # Kineto's whole-session span
PYTHON_CATEGORY = "python_function"

SORT_KEYS = {
    "cpu_time": "cpu_time",
    "cpu_time_total": "cpu_time_total",
    "self_cpu_time_total": "self_cpu_time_total",
    "count": "count",
}
for _device in ("cuda", "device", "xpu", "privateuse1", "mtia"):
    SORT_KEYS[f"{_device}_time"] = "device_time"
    SORT_KEYS[f"{_device}_time_total"] = "device_time_total"
    SORT_KEYS[f"self_{_device}_time_total"] = "self_device_time_total"
MEMORY_SORT_KEYS = frozenset(
    {
        "cpu_memory_usage",
        "self_cpu_memory_usage",
        "cuda_memory_usage",
        "self_cuda_memory_usage",
        "device_memory_usage",
        "self_device_memory_usage",
    }
)


@dataclass
class RowAverage:
    """Totals for one group of spans (times in ns)."""

    key: str
    count: int = 0
    cpu_time_total: int = 0
    self_cpu_time_total: int = 0
    device_time_total: int = 0
    self_device_time_total: int = 0
    input_shapes: str = ""
    stack: tuple[str, ...] = field(default_factory=tuple)
    sampled: bool = False
    """Times estimated from stack samples; ``count`` is then the number of samples."""

    @property
    def cpu_time(self) -> float:
        """Average CPU time per call (ns)."""
        return self.cpu_time_total / self.count if self.count else 0.0

    @property
    def device_time(self) -> float:
        """Average device time per call (ns)."""
        return self.device_time_total / self.count if self.count else 0.0

    # torch spellings
    cuda_time = device_time

    @property
    def cuda_time_total(self) -> int:
        """Alias of ``device_time_total``."""
        return self.device_time_total

    @property
    def self_cuda_time_total(self) -> int:
        """Alias of ``self_device_time_total``."""
        return self.self_device_time_total


class KeyAverages:
    """Grouped rows with ``table()`` for people and ``to_rows()`` for programs."""

    def __init__(
        self,
        rows: list[RowAverage],
        *,
        by_shape: bool,
        by_stack: bool,
        notes: list[str] | None = None,
    ) -> None:
        self.rows = rows
        self.by_shape = by_shape
        """Rows are grouped by input shapes too (the table shows them)."""
        self.by_stack = by_stack
        """Rows are grouped by enclosing Python frames too (the table shows the innermost)."""
        self.notes = notes or []
        """What a reader of the table must know (calls dropped, rows estimated from samples)."""

    def __iter__(self) -> Iterator[RowAverage]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> RowAverage:
        return self.rows[index]

    def sorted_rows(self, sort_by: str | None) -> list[RowAverage]:
        """Rows sorted descending by a torch sort key (None keeps first-seen order)."""
        if sort_by is None:
            return list(self.rows)
        if sort_by in MEMORY_SORT_KEYS:
            raise ValueError(
                f"sort_by={sort_by!r} needs memory columns, which stepscope does not record in "
                "this table yet; sort by a time or count key instead"
            )
        attr = SORT_KEYS.get(sort_by)
        if attr is None:
            valid = ", ".join(sorted(SORT_KEYS))
            raise ValueError(f"unknown sort_by {sort_by!r}; valid keys: {valid}")
        return sorted(self.rows, key=lambda r: getattr(r, attr), reverse=True)

    def table(
        self,
        sort_by: str | None = None,
        row_limit: int = 100,
        max_name_column_width: int = 55,
        header: str | None = None,
    ) -> str:
        """The rows as torch.profiler's text table."""
        from stepscope.report.table import key_averages_table

        return key_averages_table(
            self,
            sort_by=sort_by,
            row_limit=row_limit,
            max_name_column_width=max_name_column_width,
            header=header,
        )

    def __str__(self) -> str:
        return self.table()

    def to_rows(self, sort_by: str | None = None) -> list[dict[str, Any]]:
        """Rows as plain dicts (times in ns) for programs."""
        return [
            {
                "name": r.key,
                "count": r.count,
                "self_cpu_time_total_ns": r.self_cpu_time_total,
                "cpu_time_total_ns": r.cpu_time_total,
                "cpu_time_avg_ns": r.cpu_time,
                "self_device_time_total_ns": r.self_device_time_total,
                "device_time_total_ns": r.device_time_total,
                "device_time_avg_ns": r.device_time,
                "input_shapes": r.input_shapes,
                "stack": list(r.stack),
                "sampled": r.sampled,
            }
            for r in self.sorted_rows(sort_by)
        ]


def _shape_key(args: Any) -> str:
    if not args:
        return ""
    dims = args.get("Input Dims")
    return str(dims) if dims is not None else ""


def key_averages(
    traces: Iterable[Trace], group_by_input_shape: bool = False, group_by_stack_n: int = 0
) -> KeyAverages:
    """Group the spans of ``traces`` by name (plus shapes / top stack frames when asked)."""
    if isinstance(group_by_stack_n, bool) or not isinstance(group_by_stack_n, int):
        raise TypeError(f"group_by_stack_n must be an int, got {group_by_stack_n!r}")
    if group_by_stack_n < 0:
        raise ValueError(f"group_by_stack_n must be zero or more, got {group_by_stack_n}")
    groups: dict[tuple[str, str, tuple[str, ...]], RowAverage] = {}
    notes: list[str] = []
    for trace in traces:
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
            _add_sampled_rows(trace, self_ns, groups, notes)
        notes += _tracer_notes(trace)
        for i in range(len(spans)):
            cat = strings[cats[i]]
            if cat in SKIPPED_CATEGORIES:
                continue
            name = group_name(strings[names[i]])
            shapes = _shape_key(trace.args_at(argrefs[i])) if group_by_input_shape else ""
            stack: tuple[str, ...] = ()
            if group_by_stack_n:
                frames = [
                    strings[names[a]]
                    for a in nesting.ancestors(i)
                    if strings[cats[a]] == PYTHON_CATEGORY
                ]
                stack = tuple(frames[:group_by_stack_n])
            key = (name, shapes, stack)
            row = groups.get(key)
            if row is None:
                row = groups[key] = RowAverage(name, input_shapes=shapes, stack=stack)
            folded = nesting.folded[i]  # counted within its same-named parent
            if not folded:
                row.count += 1
            if cat in DEVICE_CATEGORIES:
                row.device_time_total += 0 if folded else durs[i]
                row.self_device_time_total += self_ns[i]
            else:
                row.cpu_time_total += 0 if folded else durs[i]
                row.self_cpu_time_total += self_ns[i]
    return KeyAverages(
        list(groups.values()),
        by_shape=group_by_input_shape,
        by_stack=group_by_stack_n > 0,
        notes=list(dict.fromkeys(notes)),
    )


def _add_sampled_rows(
    trace: Trace,
    self_ns: array[int],
    groups: dict[tuple[str, str, tuple[str, ...]], RowAverage],
    notes: list[str],
) -> None:
    """Rows of sampled Python functions; the spans they ran in give up that self time."""
    found = sampled_time(trace, self_ns)
    for span, taken in found.taken_from_spans.items():
        self_ns[span] -= taken
    for name, function in found.functions.items():
        row = groups.get((name, "", ()))
        if row is None:
            row = groups[(name, "", ())] = RowAverage(name, sampled=True)
        row.count += function.samples
        row.self_cpu_time_total += round(function.self_ns)
        row.cpu_time_total += round(function.total_ns)
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
