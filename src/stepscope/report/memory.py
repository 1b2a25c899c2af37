"""Memory in reports: the terminal section (per step, peak table, leak hint) and the page of
``export_memory_timeline(".html")`` (a self-contained uPlot chart, offline)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from stepscope.analysis.memory import memory_summary
from stepscope.analysis.memory_types import MemorySummary
from stepscope.report.html import asset, offline_page, script_json
from stepscope.text import clean_text

if TYPE_CHECKING:
    from stepscope.trace.model import Trace

__all__ = ["TimelineView", "human_bytes", "memory_line", "memory_renderables", "timeline_page"]


class TimelineView(Protocol):
    """What the page reads of a memory timeline (``export_memory_timeline``'s result)."""

    @property
    def device(self) -> str: ...
    @property
    def categories(self) -> Sequence[str]: ...
    @property
    def times_us(self) -> Sequence[int]: ...
    @property
    def sizes(self) -> Sequence[Sequence[int]]: ...
    @property
    def notes(self) -> Sequence[str]: ...


MAX_STEP_ROWS = 50
COLORS = (
    "#2e7d32",
    "#daa520",
    "#222222",
    "#9370db",
    "#d32f2f",
    "#1e3fb4",
    "#4169e1",
    "#9e9e9e",
    "#17a2b8",
    "#8bc34a",
    "#e91e63",
    "#795548",
)


def human_bytes(n: float | None) -> str:
    """Bytes as short text (``1.5 MiB``); ``–`` for unknown."""
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TiB"  # pragma: no cover - the loop returns at GiB


def _steps_table(m: MemorySummary) -> Table:
    devices = sorted({d for s in m.steps for d in (*s.tensor_current, *s.tensor_peak)})
    has_python = any(s.python_current is not None for s in m.steps)
    table = Table(title="Memory per step", title_justify="left")
    table.add_column("step", justify="right")
    if has_python:
        table.add_column("python held", justify="right")
        table.add_column("python peak", justify="right")
    for device in devices:
        table.add_column(f"{device} tensors held", justify="right")
        table.add_column(f"{device} tensors peak", justify="right")
    has_cuda = any(s.cuda_allocator for s in m.steps)
    if has_cuda:
        table.add_column("cuda allocated", justify="right")
        table.add_column("cuda reserved", justify="right")
    if any(s.rss is not None for s in m.steps):
        table.add_column("rss", justify="right")
    for s in m.steps[:MAX_STEP_ROWS]:
        row = [str(s.step)]
        if has_python:
            row += [human_bytes(s.python_current), human_bytes(s.python_peak)]
        for device in devices:
            row += [
                human_bytes(s.tensor_current.get(device)),
                human_bytes(s.tensor_peak.get(device)),
            ]
        if has_cuda:
            row += [
                human_bytes(s.cuda_allocator.get("allocated")),
                human_bytes(s.cuda_allocator.get("reserved")),
            ]
        if any(x.rss is not None for x in m.steps):
            row.append(human_bytes(s.rss))
        table.add_row(*row)
    if len(m.steps) > MAX_STEP_ROWS:
        table.caption = f"{len(m.steps) - MAX_STEP_ROWS} more steps in the JSON output"
    return table


def memory_renderables(m: MemorySummary | None) -> list[RenderableType]:
    """The memory section of a summary for the terminal (nothing when none was recorded)."""
    if m is None:
        return []
    parts: list[RenderableType] = []
    if m.steps:
        parts.append(_steps_table(m))
    if m.peak_table:
        what = "Python heap" if m.peak_kind == "python" else f"{m.peak_kind} tensors"
        table = Table(
            title=f"Alive at the peak: {what}, {human_bytes(m.peak_bytes)} in step {m.peak_step}",
            title_justify="left",
        )
        for name in ("allocated by", "where", "bytes", "blocks"):
            table.add_column(name, justify="left" if name in ("allocated by", "where") else "right")
        for r in m.peak_table:
            where = f"{r.file}:{r.line}" if r.file else ""
            table.add_row(r.function, where, human_bytes(r.bytes), f"{r.count:,}")
        parts.append(table)
    for leak in m.leaks:
        what = leak.what
        parts.append(
            Text(
                f"Possible leak: {what} held at step ends rose by about "
                f"{human_bytes(leak.per_step_bytes)} per step over {leak.steps} steps",
                style="bold red",
            )
        )
        for site in leak.sites:
            where = f" ({site.file}:{site.line})" if site.file else ""
            parts.append(Text(f"  grew {human_bytes(site.growth_bytes)}: {site.function}{where}"))
    if m.steps and not m.leaks and m.leak_judged:
        parts.append(
            Text("No steady rise of memory held at step ends (no leak hint).", style="dim")
        )
    for note in m.notes:
        parts.append(Text(f"Note: {note}", style="dim"))
    return parts


def memory_line(trace: Trace, prefix: str) -> str:
    """One line for a command's summary: the window's peak and the leak hint, if any."""
    m = memory_summary(trace)
    if m is None:
        return f"{prefix}: nothing recorded"
    what = "Python heap" if m.peak_kind == "python" else f"{m.peak_kind} tensors"
    line = f"{prefix}: peak {human_bytes(m.peak_bytes)} ({what}, step {m.peak_step})"
    if m.peak_table:
        top = m.peak_table[0]
        line += f", most held by {top.function}"
    for leak in m.leaks:
        line += f"; possible leak: {leak.what} +{human_bytes(leak.per_step_bytes)} per step"
    return line


_PAGE_SCRIPT = """
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("timeline-data").textContent);
  const t0 = D.times.length ? D.times[0] : 0;
  const xs = D.times.map((t) => (t - t0) / 1e3);
  const series = [{ label: "ms" }];
  const data = [xs];
  const cum = [];
  let running = xs.map(() => 0);
  D.categories.forEach((name, k) => {
    running = running.map((v, i) => v + D.sizes[i][k + 1] / 1048576);
    cum.push(running);
  });
  for (let k = D.categories.length - 1; k >= 0; k--) {
    const color = D.colors[k % D.colors.length];
    series.push({ label: D.categories[k], stroke: color, fill: color, width: 1 }); // as legend
    data.push(cum[k]);
  }
  const target = document.getElementById("chart");
  new uPlot(
    {
      width: Math.max(600, target.clientWidth || 900),
      height: 480,
      series: series,
      scales: { x: { time: false } },
      axes: [{ label: "time (ms)" }, { label: "memory (MiB)", size: 70 }],
    },
    data,
    target,
  );
  document.body.setAttribute("data-rendered", "true");
})();
"""


def timeline_page(timeline: TimelineView) -> str:
    """The memory timeline as one self-contained HTML page (stacked by category)."""
    title = html.escape(clean_text(f"stepscope memory timeline ({timeline.device})"))
    data = {
        "device": timeline.device,
        "categories": timeline.categories,
        "times": timeline.times_us,
        "sizes": timeline.sizes,
        "colors": list(COLORS),
    }
    notes = "".join(f"<p>{html.escape(clean_text(n))}</p>" for n in timeline.notes)
    peak = max((sum(row) for row in timeline.sizes), default=0)
    uplot = "vendor/uplot/uPlot"
    return offline_page(
        title,
        [
            f"<h1>{title}</h1>",
            f"<p>Peak: {html.escape(human_bytes(peak))}</p>",
            notes,
            '<div id="chart"></div>',
        ],
        "timeline-data",
        script_json(data),
        styles=[
            (asset(f"{uplot}.min.css"), "uPlot.min.css"),
            ("body{font-family:sans-serif;margin:1.5em}", "memory timeline"),
        ],
        scripts=[
            (asset(f"{uplot}.iife.min.js"), "uPlot.iife.min.js"),
            (_PAGE_SCRIPT, "memory timeline"),
        ],
    )
