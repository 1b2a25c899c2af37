"""Terminal rendering of a ``Report`` / ``DiffResult`` with ``rich``: tables and a breakdown bar."""

from __future__ import annotations

import os
import re
import sys

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from stepscope.analysis.result import (
    Category,
    CounterInfo,
    DiffResult,
    Report,
    TraceSummary,
)
from stepscope.report.memory import human_bytes, memory_renderables
from stepscope.report.overhead import overhead_lines
from stepscope.trace.merge import rank_in_name

__all__ = ["render_diff", "render_report", "render_summary"]

COLORS = {
    "data_loading": "yellow",
    "forward": "green",
    "backward": "blue",
    "optimizer": "magenta",
    "communication": "red",
    "other_annotated": "cyan",
    "other_operators": "bright_green",
    "python": "bright_yellow",
    "idle_other": "grey50",
    "computation": "green",
    "memory": "yellow",
    "other": "cyan",
    "idle": "grey50",
}


def ms(ns: float) -> str:
    """Nanoseconds as milliseconds text."""
    return f"{ns / 1e6:,.3f}"


def breakdown_bar(categories: list[Category], width: int = 60) -> Text:
    """One line of coloured blocks, a block per category in proportion to its time."""
    total = sum(c.ns for c in categories)
    bar = Text()
    if not total:
        return bar
    used = 0
    shown = [c for c in categories if c.ns > 0]
    for n, c in enumerate(shown):
        cells = width - used if n == len(shown) - 1 else round(width * c.ns / total)
        cells = max(cells, 1 if c.ns else 0)
        bar.append("█" * cells, style=COLORS.get(c.name, "white"))
        used += cells
    return bar


def _legend(categories: list[Category]) -> Text:
    legend = Text()
    for c in categories:
        if c.ns:
            legend.append("■ ", style=COLORS.get(c.name, "white"))
            legend.append(f"{c.name} {c.pct:.1f}%  ")
    return legend


def _table(title: str, columns: list[str], left: tuple[str, ...] = ("name",)) -> Table:
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right")
    return table


def _head(s: TraceSummary) -> Table:
    st = s.step_stats
    head = Table.grid(padding=(0, 2))
    whole = "" if s.has_steps else " (no ProfilerStep spans: the whole trace as one step)"
    head.add_row("steps", f"{st.count}{whole}")
    head.add_row(
        "step time (ms)",
        f"min {ms(st.min_ns)}  median {ms(st.median_ns)}  p95 {ms(st.p95_ns)}  max {ms(st.max_ns)}",
    )
    if st.slowest:
        several = len({t.source for t in s.steps}) > 1
        head.add_row(
            "slowest",
            ", ".join(
                (f"#{x.step} {ms(x.dur_ns)} ms" if x.step is not None else f"{ms(x.dur_ns)} ms")
                + (f" ({_source_label(x.source)})" if several else "")
                for x in st.slowest
            ),
        )
    return head


def _source_label(source: str) -> str:
    """A short name for the file a step came from: its rank when the name has one."""
    rank = rank_in_name(source)
    if rank is not None:
        return f"rank {rank}"
    return source if len(source) <= 32 else "…" + source[-31:]


def _steps(s: TraceSummary) -> Table:
    several = len({t.source for t in s.steps}) > 1  # a combined view: say which file
    first = ["file"] if several else []
    table = _table("Steps", [*first, "step", "ms", "host breakdown"], ("file", "host breakdown"))
    for t, b in zip(s.steps[:50], s.host_steps[:50], strict=False):
        label = [_source_label(t.source)] if several else []
        table.add_row(*label, str(t.step), ms(t.dur_ns), breakdown_bar(b.categories, 40))
    if len(s.steps) > 50:
        table.caption = f"{len(s.steps) - 50} more steps in the JSON output"
    return table


def _devices(s: TraceSummary) -> list[RenderableType]:
    parts: list[RenderableType] = []
    for d in s.devices:
        temporal = _table(
            f"Device {d.device} ({d.scope})", ["span ms", "idle %", "compute %", "non-compute %"]
        )
        temporal.add_row(
            ms(d.span_ns), f"{d.idle_pct:.2f}", f"{d.compute_pct:.2f}", f"{d.non_compute_pct:.2f}"
        )
        parts.append(temporal)
        types = _table("Kernel types (share of busy time)", ["type", "ms", "%"], ("type",))
        for k in d.kernel_types:
            types.add_row(k.kernel_type, ms(k.ns), f"{k.pct:.1f}")
        parts.append(types)
        if len(d.streams) > 1:
            streams = _table(
                "Streams",
                ["device", "stream", "events", "busy ms", "idle ms", "compute", "comm", "memory"],
            )
            for r in d.streams:
                streams.add_row(
                    r.device,
                    str(r.stream),
                    str(r.events),
                    ms(r.busy_ns),
                    ms(r.idle_ns),
                    ms(r.computation_ns),
                    ms(r.communication_ns),
                    ms(r.memory_ns),
                )
            parts.append(streams)
    return parts


def _tops(s: TraceSummary) -> list[RenderableType]:
    parts: list[RenderableType] = []
    if s.operators:
        ops = _table("Top operators", ["name", "calls", "self ms", "total ms", "self % of steps"])
        for r in s.operators:
            ops.add_row(
                r.name[:70], str(r.calls), ms(r.self_ns), ms(r.total_ns), f"{r.self_pct:.1f}"
            )
        parts.append(ops)
    if s.kernels:
        kernels = _table(
            "Top kernels",
            ["name", "type", "calls", "total ms", "mean us", "launched by"],
            ("name", "type", "launched by"),
        )
        for k in s.kernels:
            kernels.add_row(
                _short(k.name),
                k.kernel_type.lower(),
                str(k.calls),
                ms(k.total_ns),
                f"{k.mean_ns / 1e3:,.1f}",
                ", ".join(k.launched_by)[:50],
            )
        parts.append(kernels)
    if s.functions:
        funcs = _table("Top Python functions", ["name", "calls", "self ms", "total ms"])
        for f in s.functions:
            calls = f"~{f.calls}" if f.sampled else str(f.calls)
            funcs.add_row(f.name[:70], calls, ms(f.self_ns), ms(f.total_ns))
        parts.append(funcs)
    return parts


def _short(name: str, width: int = 60) -> str:
    """A kernel name without its template and argument lists, cut to ``width``."""
    short = re.sub(r"<[^<>]*>", "", name)
    while short != (shorter := re.sub(r"<[^<>]*>", "", short)):
        short = shorter
    short = re.sub(r"\(.*\)$", "", short).removeprefix("void ")
    return short[:width]


def _recommendations(s: TraceSummary) -> RenderableType:
    if not s.recommendations:
        return Text("Recommendations: none of the rules fired.", style="green")
    rec = Table(title="Recommendations", title_justify="left", show_lines=True)
    rec.add_column("finding")
    rec.add_column("evidence")
    rec.add_column("what to try")
    for r in s.recommendations:
        evidence = ", ".join(f"{k}={v}" for k, v in r.evidence.items())
        style = "bold red" if r.severity == "warning" else "bold"
        rec.add_row(Text(r.title, style=style), evidence, r.advice)
    return rec


def render_summary(s: TraceSummary) -> RenderableType:
    """Everything about one summary, as one group of rich renderables."""
    parts: list[RenderableType] = [_head(s)]
    if len(s.steps) > 1:
        parts.append(_steps(s))
    parts.append(Text("Host time per step", style="bold"))
    parts.append(breakdown_bar(s.host_total.categories))
    parts.append(_legend(s.host_total.categories))
    parts += _devices(s)
    parts += _tops(s)
    if s.launch_delay:
        ld = s.launch_delay
        parts.append(
            Text(
                f"CPU→device launch delay: {ld.count} launches, median "
                f"{ld.median_ns / 1e3:,.1f} us, p95 {ld.p95_ns / 1e3:,.1f} us, "
                f"max {ld.max_ns / 1e3:,.1f} us"
            )
        )
    parts += memory_renderables(s.memory)
    if s.counters:
        listed = ", ".join(
            f"{c.name} ({c.events} events, last {_counter_value(c)})" for c in s.counters
        )
        parts.append(Text(f"Counters: {listed}"))
    if s.dropped:
        listed = ", ".join(f"{k} {v}" for k, v in s.dropped.items())
        parts.append(Text(f"Dropped: {listed}", style="yellow"))
    parts += [Text(line) for line in overhead_lines(s.overhead)]
    for note in s.notes:
        parts.append(Text(f"Note: {note}", style="dim"))
    parts.append(_recommendations(s))
    return Group(*parts)


def render_report(report: Report, console: Console) -> None:
    """Print a report: each file (when several), then the summary of all of them."""
    if len(report.files) > 1:
        for s in report.files:
            console.print(Panel(render_summary(s), title=s.source, title_align="left"))
    title = report.combined.source
    console.print(Panel(render_summary(report.combined), title=title, title_align="left"))
    if report.ranks is not None:
        from stepscope.report.ranks import render_ranks

        console.print(Panel(render_ranks(report.ranks), title="Across ranks", title_align="left"))


def render_diff(diff: DiffResult, console: Console, top: int = 10) -> None:
    """Print a diff: the median step, categories, and the rows with the most impact."""
    s = diff.step
    color = (
        "red" if s.delta_ns > 0 and not s.within_noise else "green" if s.delta_ns < 0 else "white"
    )
    console.print(
        Text(
            f"median step: {ms(s.a_median_ns)} ms -> {ms(s.b_median_ns)} ms "
            f"({s.pct:+.1f}%, {ms(s.delta_ns)} ms)" + ("  within noise" if s.within_noise else ""),
            style=f"bold {color}",
        )
    )
    t = Table(title="Per step, by category", title_justify="left")
    for col in ("category", "A ms", "B ms", "change ms", "change %"):
        t.add_column(col, justify="right" if col != "category" else "left")
    for r in diff.categories:
        if r.a_ns or r.b_ns:
            t.add_row(
                r.name,
                ms(r.a_ns),
                ms(r.b_ns),
                ms(r.delta_ns),
                "new" if r.pct is None else f"{r.pct:+.1f}",
            )
    console.print(t)
    t = Table(title="Largest changes (per step)", title_justify="left")
    for col in ("kind", "name", "status", "A ms", "B ms", "change ms", "change %", "% of step"):
        t.add_column(col, justify="left" if col in ("kind", "name", "status") else "right")
    for r in [r for r in diff.rows if r.status != "same"][:top]:
        t.add_row(
            r.kind,
            r.name[:60],
            r.status,
            ms(r.a_ns),
            ms(r.b_ns),
            ms(r.delta_ns),
            "new" if r.pct is None else f"{r.pct:+.1f}",
            f"{r.impact_pct:+.2f}",
        )
    console.print(t)
    for note in diff.notes:
        console.print(Text(f"Note: {note}", style="dim"))


def _counter_value(c: CounterInfo) -> str:
    """A counter's last value: bytes as bytes, other large integers with separators."""
    if any(name in _BYTE_SERIES for name in c.series):
        return human_bytes(c.last)
    return f"{c.last:,.0f}" if c.last.is_integer() and abs(c.last) >= 1e4 else f"{c.last:g}"


_BYTE_SERIES = frozenset({"bytes", "Total Allocated", "Total Reserved"})


PIPED_WIDTH = 120
"""Columns when stdout is a pipe or file and COLUMNS is unset (rich would take 80 and cut cells)."""


def report_console() -> Console:
    """The console a command prints its report to: the terminal's width, or 120 when piped."""
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(file=sys.stdout, soft_wrap=False, width=PIPED_WIDTH if piped else None)
