"""Terminal rendering of a ``Report`` / ``DiffResult`` with ``rich``: tables and a breakdown bar."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from stepscope.analysis.noise import CONFIDENCE, MIN_STEPS
from stepscope.analysis.result import (
    Category,
    CounterInfo,
    DiffResult,
    DiffRow,
    Report,
    StepDiff,
    TraceSummary,
)
from stepscope.report.data_workers import data_workers_renderables
from stepscope.report.labels import fit_label, source_label, steps_across_ranks
from stepscope.report.memory import human_bytes, memory_renderables
from stepscope.report.overhead import overhead_lines
from stepscope.text import printable

__all__ = ["SafeConsole", "render_diff", "render_report", "render_summary"]

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


GLYPHS = {
    "data_loading": "D",
    "forward": "F",
    "backward": "B",
    "optimizer": "O",
    "communication": "C",
    "other_annotated": "A",
    "other_operators": "X",
    "python": "P",
    "idle_other": ".",
}
"""A letter per host category: bars and legends without colour (piped) still tell them apart."""


class BreakdownBar:
    """One line of blocks, a block per category in proportion to its time: coloured on a
    terminal, each category's letter (``GLYPHS``) when the output has no colour."""

    def __init__(self, categories: list[Category], width: int = 60) -> None:
        self.categories = categories
        self.width = width

    def text(self, plain: bool) -> Text:
        """The bar: coloured blocks, or letters when ``plain``."""
        bar = Text()
        shown = [c for c in self.categories if c.ns > 0]
        for c, cells in zip(shown, self.cells(shown), strict=True):
            glyph = GLYPHS.get(c.name, "#") if plain else "█"
            bar.append(glyph * cells, style=COLORS.get(c.name, "white"))
        return bar

    def cells(self, shown: list[Category]) -> list[int]:
        """Each category's cells: ``width`` in all, at least one each, the rest by largest
        remainder (rounding each alone could give the bar a cell too many or too few)."""
        total = sum(c.ns for c in shown)
        if not total:
            return [0] * len(shown)
        exact = [self.width * c.ns / total for c in shown]
        cells = [max(1, int(e)) for e in exact]
        while sum(cells) < self.width:
            k = max(range(len(cells)), key=lambda i: exact[i] - cells[i])
            cells[k] += 1
        while sum(cells) > self.width and max(cells) > 1:
            k = max(range(len(cells)), key=lambda i: cells[i] - exact[i])
            if cells[k] == 1:
                k = cells.index(max(cells))
            cells[k] -= 1
        return cells

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.text(console.color_system is None)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        length = self.text(plain=True).cell_len
        return Measurement(length, length)


def breakdown_bar(categories: list[Category], width: int = 60) -> BreakdownBar:
    """The bar of ``categories`` (see ``BreakdownBar``)."""
    return BreakdownBar(categories, width)


class _Legend:
    """The categories' shares, each with its colour (or its letter without colour)."""

    def __init__(self, categories: list[Category]) -> None:
        self.categories = categories

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        plain = console.color_system is None
        legend = Text()
        for c in self.categories:
            if c.ns:
                key = f"{GLYPHS.get(c.name, '#')} " if plain else "■ "
                legend.append(key, style=COLORS.get(c.name, "white"))
                legend.append(f"{c.name} {c.pct:.1f}%  ")
        yield legend


def _table(title: str, columns: list[str], left: tuple[str, ...] = ("name",)) -> Table:
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, justify="left" if col in left else "right")
    return table


def _head(s: TraceSummary, per_rank: list[int] | None = None) -> Table:
    st = s.step_stats
    head = Table.grid(padding=(0, 2))
    whole = "" if s.has_steps else " (no ProfilerStep spans: the whole trace as one step)"
    cut = f" (and {len(s.cut_short)} cut short, left out)" if s.cut_short else ""
    counted = steps_across_ranks(st.count, per_rank) if per_rank else str(st.count)
    head.add_row("steps", f"{counted}{whole}{cut}")
    head.add_row(
        "step time (ms)",
        f"min {ms(st.min_ns)}  median {ms(st.median_ns)}  p95 {ms(st.p95_ns)}  max {ms(st.max_ns)}"
        if st.count
        else "- (no complete step)",
    )
    if st.slowest:
        several = len({t.source for t in s.steps}) > 1
        head.add_row(
            "slowest",
            ", ".join(
                (f"#{x.step} {ms(x.dur_ns)} ms" if x.step is not None else f"{ms(x.dur_ns)} ms")
                + (f" ({source_label(x.source, s.windows)})" if several else "")
                for x in st.slowest
            ),
        )
    return head


def _steps(s: TraceSummary) -> Table:
    several = len({t.source for t in s.steps}) > 1  # a combined view: say which file
    first = ["file"] if several else []
    windows = s.windows if len(set(s.windows.values())) == len(s.windows) else None
    table = _table("Steps", [*first, "step", "ms", "host breakdown"], ("file", "host breakdown"))
    for t, b in zip(s.steps[:50], s.host_steps[:50], strict=False):
        label = [source_label(t.source, windows)] if several else []
        table.add_row(*label, str(t.step), ms(t.dur_ns), breakdown_bar(b.categories, 40))
    for t in s.cut_short[:10]:
        label = [source_label(t.source, windows)] if several else []
        cut = Text("cut short: the profile stopped inside it (not counted)", style="dim")
        table.add_row(*label, str(t.step), Text(ms(t.dur_ns), style="dim"), cut)
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
                fit_label(r.name, 70),
                str(r.calls),
                ms(r.self_ns),
                ms(r.total_ns),
                f"{r.self_pct:.1f}",
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
            funcs.add_row(fit_label(f.name, 70), calls, ms(f.self_ns), ms(f.total_ns))
        if any(f.sampled for f in s.functions):
            funcs.caption = "~N: stack samples that saw the function, not a count of its calls"
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


def render_summary(s: TraceSummary, per_rank: list[int] | None = None) -> RenderableType:
    """Everything about one summary, as one group of rich renderables (``per_rank``: each
    rank's step count, when the summary joins several ranks)."""
    parts: list[RenderableType] = [_head(s, per_rank)]
    if len(s.steps) > 1 or s.cut_short:
        parts.append(_steps(s))
    if s.host_total.total_ns:
        parts.append(Text("Host time per step", style="bold"))
        parts.append(breakdown_bar(s.host_total.categories))
        parts.append(_Legend(s.host_total.categories))
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
    parts += data_workers_renderables(s.data_workers)
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


def windows_of_one_run(report: Report) -> bool:
    """Whether the files are the windows of one run (``--repeat 0``): each names a different
    window and none comes from another rank."""
    files = report.files
    labels = [report.combined.windows.get(s.source, "") for s in files]
    return (
        len(files) > 1 and report.ranks is None and all(labels) and len(set(labels)) == len(labels)
    )


def _windows(report: Report) -> Table:
    table = _table("Windows", ["window", "file", "steps", "median step ms"], ("window", "file"))
    for s in report.files:
        table.add_row(
            report.combined.windows[s.source],
            s.source,
            str(s.step_stats.count),
            ms(s.step_stats.median_ns) if s.step_stats.count else "-",
        )
    return table


def render_report(report: Report, console: Console) -> None:
    """Print a report: each file (when several, unless they are the windows of one run: then
    a table of them), then the summary of all of them."""
    title = report.combined.source
    per_rank = [r.steps for r in report.ranks.ranks] if report.ranks is not None else None
    body = render_summary(report.combined, per_rank)
    if windows_of_one_run(report):
        title = f"all {len(report.files)} windows"
        body = Group(_windows(report), body)
    elif len(report.files) > 1:
        for s in report.files:
            console.print(Panel(render_summary(s), title=Text(s.source), title_align="left"))
    console.print(Panel(body, title=Text(title), title_align="left"))
    if report.ranks is not None:
        from stepscope.report.ranks import render_ranks

        console.print(Panel(render_ranks(report.ranks), title="Across ranks", title_align="left"))


def _change_pct(row: DiffRow) -> str:
    """A row's relative change; none for a change under the diff's threshold (``same``)."""
    if row.pct is None:
        return "new"
    return "same" if row.status == "same" else f"{row.pct:+.1f}"


def step_verdict(s: StepDiff) -> str:
    """The step change in one line: medians, the shift's interval and whether it is noise."""
    text = f"median step: {ms(s.a_median_ns)} ms -> {ms(s.b_median_ns)} ms ({s.pct:+.1f}%)"
    if s.a_steps < MIN_STEPS or s.b_steps < MIN_STEPS:
        return text + f"; too few steps ({s.a_steps} and {s.b_steps}) to tell noise from change"
    text += (
        f"; shift {s.shift_ns / 1e6:+,.3f} ms ({CONFIDENCE:.0%} interval "
        f"{s.shift_low_ns / 1e6:+,.3f} to {s.shift_high_ns / 1e6:+,.3f}; drift within a run "
        f"{ms(s.noise_ns)} ms)"
    )
    return text + ("  within noise" if s.within_noise else "  beyond the run-to-run spread")


def render_diff(diff: DiffResult, console: Console, top: int = 10) -> None:
    """Print a diff: the median step, categories, and the rows with the most impact."""
    s = diff.step
    color = "white" if s.within_noise else "red" if s.delta_ns > 0 else "green"
    for line in diff.mismatches:
        console.print(Text(f"Not comparable: {line}", style="bold yellow"))
    console.print(Text(step_verdict(s), style=f"bold {color}"))
    t = Table(title="Mean per step, by category", title_justify="left")
    for col in ("category", "A ms", "B ms", "change ms", "change %"):
        t.add_column(col, justify="right" if col != "category" else "left")
    for r in diff.categories:
        if r.a_ns or r.b_ns:
            t.add_row(r.name, ms(r.a_ns), ms(r.b_ns), ms(r.delta_ns), _change_pct(r))
    mean_delta = s.b_mean_ns - s.a_mean_ns
    t.add_row(
        "mean step",
        ms(s.a_mean_ns),
        ms(s.b_mean_ns),
        ms(mean_delta),
        f"{100.0 * mean_delta / s.a_mean_ns:+.1f}" if s.a_mean_ns else "-",
        style="bold",
    )
    console.print(t)
    t = Table(title="Largest changes (mean per step)", title_justify="left")
    for col in ("kind", "name", "status", "A ms", "B ms", "change ms", "change %", "% of step"):
        t.add_column(col, justify="left" if col in ("kind", "name", "status") else "right")
    for r in [r for r in diff.rows if r.status != "same"][:top]:
        t.add_row(
            r.kind,
            fit_label(r.name, 60),
            r.status,
            ms(r.a_ns),
            ms(r.b_ns),
            ms(r.delta_ns),
            _change_pct(r),
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


class SafeConsole(Console):
    """A console for text from traces: no markup, and every control character, terminal escape
    and unpaired surrogate shown as a visible escape (a trace never drives its reader's terminal).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(markup=False, emoji=False, highlight=False, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        """The text made printable before rich measures it."""
        return super().render_str(printable(text), **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        # the last gate: text built as ``Text`` objects never passed through render_str
        return super()._render_buffer(
            Segment(printable(t), style, control) if not control else Segment(t, style, control)
            for t, style, control in buffer
        )


def report_console() -> Console:
    """The console a command prints its report to: the terminal's width, or 120 when piped."""
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return SafeConsole(file=sys.stdout, soft_wrap=False, width=PIPED_WIDTH if piped else None)
