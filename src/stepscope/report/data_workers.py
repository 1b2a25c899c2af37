"""The DataLoader workers section of a report: the terminal's renderables and Markdown's lines."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from stepscope.analysis.data_workers_types import DataWorkersSummary, LoaderReport

__all__ = ["data_workers_markdown", "data_workers_renderables"]

MAX_STEP_ROWS = 30
SETTINGS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "start_method")
STATUS_STYLE = {"late": "red", "just_in_time": "yellow", "ahead": "green", "in_loop": "red"}


def _ms(ns: float | None) -> str:
    return "–" if ns is None else f"{ns / 1e6:,.2f}"


def _worker(w: int) -> str:
    return "loop" if w < 0 else str(w)


def _headline(x: LoaderReport) -> str:
    settings = ", ".join(f"{k}={x.settings.get(k)}" for k in SETTINGS if k in x.settings)
    dataset = x.settings.get("dataset", "?")
    return f"DataLoader {x.loader} ({dataset}; {settings})"


def _counts(x: LoaderReport) -> str:
    parts = [
        f"{n} {label}"
        for n, label in (
            (x.ahead, "ahead"),
            (x.just_in_time, "just in time"),
            (x.late, "late"),
            (x.in_loop, "made in the loop"),
            (x.unknown, "made before recording"),
        )
        if n
    ]
    line = f"batches taken by {len(x.steps)} steps: {', '.join(parts) or 'none'}"
    line += f"; the loop waited {_ms(x.wait_ns)} ms"
    if x.ready_ahead_median is not None:
        line += f"; batches ready when a step asked: median {x.ready_ahead_median:g}"
    return line


def data_workers_renderables(section: DataWorkersSummary | None) -> list[RenderableType]:
    """The section for the terminal (nothing without recorded loaders)."""
    if section is None or not section.loaders:
        return []
    parts: list[RenderableType] = []
    for x in section.loaders:
        parts.append(Text(_headline(x), style="bold"))
        parts.append(Text(_counts(x)))
        if x.workers:
            table = Table(title="workers", title_justify="left")
            for col in ("worker", "pids", "batches", "busy %", "dataset ms", "collate ms"):
                table.add_column(col, justify="left" if col == "pids" else "right")
            for w in x.workers:
                table.add_row(
                    str(w.worker),
                    ", ".join(map(str, w.pids)) + (" (exited)" if w.exited else ""),
                    str(w.batches),
                    f"{w.busy_pct:.1f}",
                    _ms(w.dataset_ns),
                    _ms(w.collate_ns),
                )
            parts.append(table)
        if x.steps:
            table = Table(title="batch per step", title_justify="left")
            columns = ["step", "batch", "worker", "ready", "margin ms", "wait ms", "dataset ms"]
            columns += ["dataset cpu ms", "collate ms", "pin ms", "transfer ms", "waiting"]
            for col in columns:
                table.add_column(col, justify="left" if col == "ready" else "right")
            for r in x.steps[:MAX_STEP_ROWS]:
                table.add_row(
                    str(r.step),
                    f"{r.epoch}:{r.batch}" if r.epoch else str(r.batch),
                    _worker(r.worker),
                    Text(r.status.replace("_", " "), style=STATUS_STYLE.get(r.status, "")),
                    _ms(r.margin_ns),
                    _ms(r.wait_ns),
                    _ms(r.dataset_ns),
                    _ms(r.dataset_cpu_ns),
                    _ms(r.collate_ns),
                    _ms(r.pin_ns),
                    _ms(r.transfer_ns),
                    "–" if r.ready_ahead is None else str(r.ready_ahead),
                )
            parts.append(table)
            if len(x.steps) > MAX_STEP_ROWS:
                parts.append(Text(f"({len(x.steps) - MAX_STEP_ROWS} more steps in --json)"))
        if x.functions:
            table = Table(
                title=f"slowest dataset functions ({x.dataset_samples} worker samples)",
                title_justify="left",
            )
            for col in ("function", "self samples", "self %", "total samples"):
                table.add_column(col, justify="left" if col == "function" else "right")
            for f in x.functions:
                table.add_row(
                    f.name, str(f.self_samples), f"{f.self_pct:.1f}", str(f.total_samples)
                )
            parts.append(table)
        for note in x.notes:
            parts.append(Text(f"Note: {note}", style="dim"))
    return parts


def data_workers_markdown(
    section: DataWorkersSummary | None, escape: Callable[[str], str]
) -> list[str]:
    """The section as Markdown lines (``escape`` makes trace text literal)."""
    if section is None or not section.loaders:
        return []
    lines = ["", "DataLoader workers:", ""]
    for x in section.loaders:
        lines.append(f"- {escape(_headline(x))}: {escape(_counts(x))}")
        for w in x.workers:
            lines.append(f"  - worker {w.worker}: busy {w.busy_pct:.1f} %, {w.batches} batches")
        if x.functions:
            f = x.functions[0]
            lines.append(
                f"  - slowest dataset function: {escape(f.name)} ({f.self_pct:.1f} % of samples)"
            )
    return lines
