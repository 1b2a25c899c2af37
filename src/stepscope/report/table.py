"""torch.profiler's ``key_averages().table()`` text table, from any result shaped like
``key_averages()`` (:class:`AveragesTable`, defined here so the renderer imports no profiler)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from stepscope.report.labels import fit_function_label

__all__ = ["AveragedRow", "AveragesTable", "key_averages_table"]


class AveragedRow(Protocol):
    """What the table reads of one ``key_averages()`` row (torch's ``FunctionEventAvg``; µs)."""

    @property
    def key(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def cpu_time(self) -> float: ...
    @property
    def cpu_time_total(self) -> float: ...
    @property
    def self_cpu_time_total(self) -> float: ...
    @property
    def device_time(self) -> float: ...
    @property
    def device_time_total(self) -> float: ...
    @property
    def self_device_time_total(self) -> float: ...
    @property
    def cpu_memory_usage(self) -> int: ...
    @property
    def self_cpu_memory_usage(self) -> int: ...
    @property
    def device_memory_usage(self) -> int: ...
    @property
    def self_device_memory_usage(self) -> int: ...
    @property
    def input_shapes(self) -> Any: ...
    @property
    def stack(self) -> list[str]: ...
    @property
    def overload_name(self) -> str: ...
    @property
    def flops(self) -> int: ...
    @property
    def sampled(self) -> bool: ...
    @property
    def on_device(self) -> bool: ...
    @property
    def is_user_annotation(self) -> bool: ...
    @property
    def cpu_parent(self) -> object | None: ...


class AveragesTable(Protocol):
    """What the table reads of a ``key_averages()`` result: its rows and how they were made."""

    @property
    def rows(self) -> Sequence[AveragedRow]: ...
    @property
    def use_device(self) -> str | None: ...
    @property
    def by_shape(self) -> bool: ...
    @property
    def by_stack(self) -> bool: ...
    @property
    def profile_memory(self) -> bool: ...
    @property
    def with_flops(self) -> bool: ...
    @property
    def notes(self) -> list[str]: ...

    def sorted_rows(self, sort_by: str | None) -> Sequence[AveragedRow]: ...


TIME_UNITS = (None, "s", "ms", "us")
FLOP_UNITS = ("FLOPs", "KFLOPs", "MFLOPs", "GFLOPs", "TFLOPs", "PFLOPs")
COLUMN = 12


def _format_time(us: float, unit: str | None = None) -> str:
    if unit == "s" or (unit is None and us >= 1e6):
        return f"{us / 1e6:.3f}s"
    if unit == "ms" or (unit is None and us >= 1e3):
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _format_percent(part: float, whole: float) -> str:
    if not whole:
        return "NaN" if not part else "inf"
    return f"{100.0 * part / whole:.2f}%"


def _format_memory(nbytes: int) -> str:
    for size, unit in ((1024**3, "GB"), (1024**2, "MB"), (1024, "KB")):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} B"


def _flops_scale(rows: Sequence[AveragedRow]) -> tuple[float, str] | None:
    positive = [r.flops for r in rows if r.flops > 0]
    if not positive:
        return None
    step = int(max(0.0, min(math.log10(min(positive)) / 3, float(len(FLOP_UNITS) - 1))))
    return 10.0 ** (-3 * step), FLOP_UNITS[step]


def key_averages_table(
    averages: AveragesTable,
    *,
    sort_by: str | None = None,
    row_limit: int = 100,
    max_src_column_width: int = 75,
    max_name_column_width: int = 55,
    max_shapes_column_width: int = 80,
    header: str | None = None,
    top_level_events_only: bool = False,
    time_unit: str | None = None,
) -> str:
    """The rows as torch.profiler's text table (times in torch's units, notes underneath)."""
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of 's', 'ms', 'us' or None, got {time_unit!r}")
    rows = averages.sorted_rows(sort_by)
    if top_level_events_only:
        rows = [r for r in rows if r.cpu_parent is None]
    if row_limit is not None and row_limit >= 0:
        rows = rows[:row_limit]
    self_cpu_total = sum(r.self_cpu_time_total for r in averages.rows)
    self_device_total = sum(
        r.self_device_time_total for r in averages.rows if r.on_device and not r.is_user_annotation
    )
    has_device = any(r.self_device_time_total > 0 for r in averages.rows)
    device = (averages.use_device or "cuda").upper()
    has_overload = any(r.overload_name for r in rows)
    has_shapes = averages.by_shape and any(r.input_shapes for r in rows)
    has_stack = averages.by_stack and any(r.stack for r in rows)
    has_device_mem = any(r.self_device_memory_usage > 0 for r in averages.rows)
    flops = _flops_scale(rows) if averages.with_flops else None
    columns = ["Name"]
    if has_overload:
        columns.append("Overload Name")
    columns += ["Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if has_device:
        columns += [f"Self {device}", f"Self {device} %", f"{device} total", f"{device} time avg"]
    if averages.profile_memory:
        columns += ["CPU Mem", "Self CPU Mem"]
        if has_device_mem:
            columns += [f"{device} Mem", f"Self {device} Mem"]
    columns.append("# of Calls")
    if has_shapes:
        columns.append("Input Shapes")
    if flops is not None:
        columns.append(f"Total {flops[1]}")
    if has_stack:
        columns.append("Source Location")
    body: list[list[str]] = []
    extra_lines: list[list[str]] = []
    for r in rows:
        name = r.key
        if len(name) >= max_name_column_width - 3:
            # cut as torch's table does; a function's label keeps its name and file whole
            whole = fit_function_label(name, max_name_column_width)
            name = whole if whole is not None else name[: max_name_column_width - 3] + "..."
        cells = [name]
        if has_overload:
            cells.append(r.overload_name[: max_name_column_width - 3])
        cells += [
            _format_percent(r.self_cpu_time_total, self_cpu_total),
            _format_time(r.self_cpu_time_total, time_unit),
            _format_percent(r.cpu_time_total, self_cpu_total),
            _format_time(r.cpu_time_total, time_unit),
            "-" if r.sampled else _format_time(r.cpu_time, time_unit),
        ]
        if has_device:
            cells += [
                _format_time(r.self_device_time_total, time_unit),
                _format_percent(r.self_device_time_total, self_device_total),
                _format_time(r.device_time_total, time_unit),
                _format_time(r.device_time, time_unit),
            ]
        if averages.profile_memory:
            cells += [_format_memory(r.cpu_memory_usage), _format_memory(r.self_cpu_memory_usage)]
            if has_device_mem:
                cells += [
                    _format_memory(r.device_memory_usage),
                    _format_memory(r.self_device_memory_usage),
                ]
        cells.append(f"~{r.count}" if r.sampled else str(r.count))
        if has_shapes:
            cells.append(str(r.input_shapes)[:max_shapes_column_width])
        if flops is not None:
            cells.append(f"{r.flops * flops[0]:8.3f}" if r.flops > 0 else "--")
        if has_stack:
            frames = [f[-max_src_column_width:] for f in r.stack] or [""]
            cells.append(frames[0])
            body.append(cells)
            extra_lines += [[""] * (len(columns) - 1) + [f] for f in frames[1:]]
            continue
        body.append(cells)
    widths = [max(len(c), COLUMN) for c in columns]
    widths[0] = len(columns[0])
    for cells in [*body, *extra_lines]:
        widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]
    rule = "  ".join("-" * w for w in widths)

    def line(cells: list[str]) -> str:
        last = len(cells) - 1
        return "  ".join(
            c.ljust(w) if has_stack and k == last else c.rjust(w)
            for k, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = []
    if header:
        out.append("=" * len(rule))
        out.append(header)
    if top_level_events_only:
        out.append("=" * len(rule))
        out.append("This report only display top-level ops statistics")
    out += [rule, line(columns), rule]
    if has_stack:
        extra = iter(extra_lines)
        for r, cells in zip(rows, body, strict=True):
            out.append(line(cells))
            out += [line(next(extra)) for _ in r.stack[1:]]
    else:
        out += [line(cells) for cells in body]
    out.append(rule)
    out.append(f"Self CPU time total: {_format_time(self_cpu_total, time_unit)}")
    if has_device:
        out.append(f"Self {device} time total: {_format_time(self_device_total, time_unit)}")
    out += [f"Note: {note}" for note in averages.notes]
    return "\n".join(out) + "\n"
