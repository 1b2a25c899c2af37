"""``stepscope fleet`` rendered: rich tables for the terminal, one offline HTML page."""

from __future__ import annotations

import html
import os
import re
from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from stepscope.atomic import atomic_output
from stepscope.report.html import VENDOR_STYLES, asset, offline_page, script_json
from stepscope.steptables.fleet import FleetReport, SlowRank
from stepscope.text import clean_text

__all__ = [
    "PHASE_WORDS",
    "finding",
    "fleet_html",
    "render_fleet",
    "render_rows",
    "write_fleet_html",
]

WORST_STEPS = 10
"""Steps listed with their straggler (the ones with the largest lag)."""
_UPLOT = "vendor/uplot/uPlot.iife.min.js"
TABLE_IDS = ("slow-ranks", "worst-steps", "drift")
"""The page's sections, in ``_sections`` order."""


PHASE_WORDS = {
    "data_wait": "waiting for its data (the DataLoader)",
    "optimizer": "in the optimizer step",
    "gc": "in Python's garbage collection",
    "compute": "computing (forward and backward on the host's CPU)",
    "host": "in its own host Python off the CPU (sleeps, I/O, locks, waiting for a device)",
}
"""What each fleet phase means, in the finding's words."""


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.1f}"


def finding(s: SlowRank, ranks: int) -> str:
    """One slow rank's evidence in a sentence: who waited for it since when, and why."""
    where = PHASE_WORDS.get(s.phase, s.phase)
    busy = f"its own time exceeds the others' by {_ms(s.mean_lag_ns)} ms a step, mostly {where}"
    if s.waited_ns is None or s.waiting_ranks is None:  # version-1 tables: no collective time
        return f"Rank {s.rank} lags the others since step {s.since_step}: {busy}."
    before = "" if s.waited_before_ns is None else f" ({_ms(s.waited_before_ns)} ms before)"
    least = "" if s.least_wait else "; another rank waited less than it"
    others = ranks - 1
    who = (
        ("the other rank" if others == 1 else f"all {others} other ranks")
        if s.waiting_ranks == others
        else f"{s.waiting_ranks} of the {others} other ranks"
    )
    return (
        f"Rank {s.rank} is the rank the others waited for since step {s.since_step}: "
        f"{who} waited for it at collectives, {_ms(s.waited_ns)} ms a step{before}; "
        f"{busy}{least}."
    )


def _sections(r: FleetReport) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, columns, rows) of each table, shared by the terminal and the page."""
    worst = sorted(r.stragglers, key=lambda s: -s.lag_ns)[:WORST_STEPS]
    return [
        (
            "Ranks slow since a step",
            ["run", "rank", "since step", "slow steps", "mean lag ms", "phase",
             "others waited ms", "before ms", "ranks waiting"],
            [
                [s.run, str(s.rank), str(s.since_step), f"{s.slow_steps}/{s.steps}",
                 _ms(s.mean_lag_ns), s.phase, _maybe_ms(s.waited_ns),
                 _maybe_ms(s.waited_before_ns),
                 "-" if s.waiting_ranks is None else f"{s.waiting_ranks}/{r.ranks - 1}"]
                for s in r.slow_ranks
            ],
        ),
        (
            f"Steps with the largest lag (of {len(r.stragglers)})",
            ["run", "step", "slowest rank", "lag ms", "phase", "mean step ms", "ranks"],
            [
                [s.run, str(s.step), str(s.rank), _ms(s.lag_ns), s.phase,
                 _ms(s.mean_duration_ns), str(s.ranks)]
                for s in worst
            ],
        ),
        (
            "Drift (each tenth of the steps)",
            ["run", "steps", "median step ms", "median lag ms"],
            [
                [d.run, f"{d.first_step}-{d.last_step}", _ms(d.median_duration_ns),
                 _ms(d.median_lag_ns)]
                for d in r.drift
            ],
        ),
    ]  # fmt: skip


def _maybe_ms(ns: int | None) -> str:
    return "-" if ns is None else _ms(ns)


def _headline(r: FleetReport) -> str:
    runs = ", ".join(r.runs)
    return f"{r.rows:,} step rows: {r.ranks} ranks, {r.steps:,} steps, run {runs}"


def _rich_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    return table


def render_fleet(r: FleetReport) -> RenderableType:
    """The fleet report for the terminal."""
    parts: list[RenderableType] = [Text(_headline(r), style="bold")]
    if not r.slow_ranks:
        parts.append(Text("no rank lags the others in most of its steps", style="green"))
    for slow in r.slow_ranks:
        parts.append(Text(finding(slow, r.ranks), style="yellow"))
    for title, columns, rows in _sections(r):
        if rows:
            parts.append(_rich_table(title, columns, rows))
    for note in r.notes:
        parts.append(Text(f"Note: {note}", style="dim"))
    return Group(*parts)


def render_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    """A ``--sql`` result for the terminal."""
    return _rich_table(f"{len(rows)} rows", columns, rows)


_NUMBER = re.compile(r"[-+]?[\d.,/]+")
"""A cell of a numeric column (``20.1``, ``30/30``, ``0-5``): right-aligned."""


def _html_table(key: str, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    numeric = [all(_NUMBER.fullmatch(row[i]) for row in rows) for i in range(len(columns))]
    kind = [' class="num"' if n else "" for n in numeric]
    head = "".join(f"<th{k}>{html.escape(c)}</th>" for c, k in zip(columns, kind, strict=True))
    body = "".join(
        "<tr>"
        + "".join(f"<td{k}>{html.escape(v)}</td>" for v, k in zip(row, kind, strict=True))
        + "</tr>"
        for row in rows
    )
    return (
        f'<section class="card" id="{key}"><h2>{html.escape(title)}</h2>'
        f'<div class="tablewrap"><table class="fleet"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div></section>"
    )


def fleet_html(r: FleetReport) -> str:
    """The fleet report as one self-contained page (tables, and a chart of each step's lag)."""
    title = html.escape(f"stepscope fleet: {r.path}")
    body = [
        f'<header id="top"><h1>{title}</h1></header>',
        "<main>",
        f"<p>{html.escape(_headline(r))}</p>",
        *(f'<p class="finding">{html.escape(finding(s, r.ranks))}</p>' for s in r.slow_ranks),
        '<section class="card"><h2>Largest lag per step (ms)</h2><div id="lag-chart"></div>'
        "</section>",
        *(
            _html_table(key, t, c, rows)
            for key, (t, c, rows) in zip(TABLE_IDS, _sections(r), strict=True)
            if rows
        ),
        *(f'<p class="note">Note: {html.escape(clean_text(n))}</p>' for n in r.notes),
        "</main>",
    ]
    data = {
        "step": [s.step for s in r.stragglers],
        "lag_ms": [s.lag_ns / 1e6 for s in r.stragglers],
        "rank": [s.rank for s in r.stragglers],
    }
    return offline_page(
        title,
        body,
        "stepscope-fleet",
        script_json(data),
        styles=[(asset(n), n) for n in (*VENDOR_STYLES, "report.css")],
        scripts=[(asset(n), n) for n in (_UPLOT, "fleet.js")],
    )


def write_fleet_html(r: FleetReport, path: str | os.PathLike[str]) -> None:
    """Write the page atomically."""
    with atomic_output(path, what="HTML fleet report") as fh:
        fh.write(fleet_html(r).encode("utf-8"))
