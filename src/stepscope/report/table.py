"""torch.profiler's ``key_averages().table()`` text table, from a :class:`KeyAverages`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stepscope.profiler.summary import KeyAverages

__all__ = ["key_averages_table"]


def _format_time(ns: float) -> str:
    us = ns / 1000.0
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _format_percent(part: float, whole: float) -> str:
    return f"{(100.0 * part / whole) if whole else 0.0:.2f}%"


def key_averages_table(
    averages: KeyAverages,
    *,
    sort_by: str | None = None,
    row_limit: int = 100,
    max_name_column_width: int = 55,
    header: str | None = None,
) -> str:
    """The rows as torch.profiler's text table (times in torch's units, notes underneath)."""
    rows = averages.sorted_rows(sort_by)
    if row_limit is not None and row_limit >= 0:
        rows = rows[:row_limit]
    self_cpu_total = sum(r.self_cpu_time_total for r in averages.rows)
    self_device_total = sum(r.self_device_time_total for r in averages.rows)
    has_device = self_device_total > 0
    columns = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if has_device:
        columns += ["Self CUDA", "Self CUDA %", "CUDA total", "CUDA time avg"]
    columns.append("# of Calls")
    if averages.by_shape:
        columns.append("Input Shapes")
    if averages.by_stack:
        columns.append("Source Location")
    body: list[list[str]] = []
    for r in rows:
        name = r.key
        if len(name) > max_name_column_width:
            name = name[: max_name_column_width - 3] + "..."
        cells = [
            name,
            _format_percent(r.self_cpu_time_total, self_cpu_total),
            _format_time(r.self_cpu_time_total),
            _format_percent(r.cpu_time_total, self_cpu_total),
            _format_time(r.cpu_time_total),
            "-" if r.sampled else _format_time(r.cpu_time),
        ]
        if has_device:
            cells += [
                _format_time(r.self_device_time_total),
                _format_percent(r.self_device_time_total, self_device_total),
                _format_time(r.device_time_total),
                _format_time(r.device_time),
            ]
        cells.append(f"~{r.count}" if r.sampled else str(r.count))
        if averages.by_shape:
            cells.append(r.input_shapes)
        if averages.by_stack:
            cells.append(r.stack[0] if r.stack else "")
        body.append(cells)
    widths = [len(c) for c in columns]
    for cells in body:
        widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]
    widths[0] = max(widths[0], min(max_name_column_width, widths[0]))
    rule = "  ".join("-" * w for w in widths)

    def line(cells: list[str]) -> str:
        parts = [cells[0].rjust(widths[0])]
        parts += [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join(parts)

    out = []
    if header:
        out.append("=" * len(rule))
        out.append(header)
    out += [rule, line(columns), rule]
    out += [line(cells) for cells in body]
    out.append(rule)
    out.append(f"Self CPU time total: {_format_time(self_cpu_total)}")
    if has_device:
        out.append(f"Self CUDA time total: {_format_time(self_device_total)}")
    out += [f"Note: {note}" for note in averages.notes]
    return "\n".join(out) + "\n"
