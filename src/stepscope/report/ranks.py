"""The cross-rank sections of a report: terminal tables and the HTML heat map's data."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from stepscope.analysis.ranks import RanksReport

__all__ = ["heatmap_data", "render_ranks"]

MAX_STEPS_SHOWN = 30


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f}"


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}" if whole else "-"


def _stragglers(r: RanksReport) -> RenderableType:
    if not r.stragglers:
        return Text("No straggler: no rank kept the others waiting.", style="green")
    table = Table(title="Stragglers (the others waited for them)", title_justify="left")
    columns = ("rank", "others waiting ms", "busy excess ms/step", "slowest in", "evidence")
    for col in columns:
        table.add_column(col, justify="left" if col == "evidence" else "right")
    for s in r.stragglers:
        evidence = (
            f"{s.phase} {_ms(s.phase_ns)} ms per step vs {_ms(s.others_median_ns)} ms on the "
            f"other ranks (medians over steps), most in step {s.step}"
            if s.step is not None
            else "-"
        )
        table.add_row(
            str(s.rank),
            _ms(s.late_ns),
            _ms(s.excess_per_step_ns),
            f"{s.slowest_steps}/{len(r.steps)} steps",
            evidence,
        )
    return table


def _per_rank(r: RanksReport) -> Table:
    table = Table(title="Per rank (host time over the analysed steps)", title_justify="left")
    columns = ["rank", "steps", "median step ms", "computation %", "communication %", "idle %"]
    columns += ["waiting at collectives ms"]
    columns += ["clock offset us"]
    with_device = any(row.device is not None for row in r.ranks)
    if with_device:
        columns += ["device idle %", "device compute %", "device non-compute %"]
    for col in columns:
        table.add_column(col, justify="right")
    for row in r.ranks:
        offset = (
            f"{row.clock_offset_ns / 1e3:+,.1f} ± {row.clock_uncertainty_ns / 1e3:,.1f}"
            if row.clock_offset_ns is not None and row.clock_uncertainty_ns is not None
            else "not measured"
        )
        cells = [
            str(row.rank),
            str(row.steps),
            _ms(row.step_median_ns),
            _pct(row.computation_ns, row.total_ns),
            _pct(row.communication_ns, row.total_ns),
            _pct(row.idle_ns, row.total_ns),
            _ms(row.collective_wait_ns),
            offset,
        ]
        if with_device:
            d = row.device
            cells += (
                [f"{d.idle_pct:.1f}", f"{d.compute_pct:.1f}", f"{d.non_compute_pct:.1f}"]
                if d is not None
                else ["-", "-", "-"]
            )
        table.add_row(*cells)
    return table


def _steps(r: RanksReport) -> Table:
    ranks = [str(row.rank) for row in r.ranks]
    table = Table(title="Step time per rank (ms; * slowest: most time not waiting)")
    table.title_justify = "left"
    table.add_column("step", justify="right")
    for rank in ranks:
        table.add_column(f"rank {rank}", justify="right")
    table.add_column("slowest", justify="right")
    for s in r.steps[:MAX_STEPS_SHOWN]:
        cells = [_ms(s.step_ns[k]) + ("*" if k == str(s.slowest_rank) else " ") for k in ranks]
        table.add_row(str(s.step), *cells, f"rank {s.slowest_rank}")
    if len(r.steps) > MAX_STEPS_SHOWN:
        table.caption = f"{len(r.steps) - MAX_STEPS_SHOWN} more steps in the JSON output"
    return table


def _collectives(r: RanksReport) -> Table:
    ranks = [str(row.rank) for row in r.ranks]
    table = Table(title="Waiting at collectives (ms, per rank)", title_justify="left")
    table.caption = "waiting at collectives is part of communication in every breakdown"
    for col in ("collective", "group", "elements", "calls", *[f"rank {k}" for k in ranks]):
        table.add_column(col, justify="left" if col in ("collective", "group") else "right")
    for c in r.collectives[:20]:
        table.add_row(
            f"{c.collective} ({c.dtype})" if c.dtype else c.collective,
            c.group or "-",
            f"{c.nelems:,}" if c.nelems >= 0 else "?",
            str(c.calls),
            *[_ms(c.wait_ns[k]) for k in ranks],
        )
    return table


def render_ranks(r: RanksReport) -> RenderableType:
    """The cross-rank sections as one group of rich renderables."""
    parts: list[RenderableType] = [_stragglers(r), _per_rank(r)]
    if r.steps:
        parts.append(_steps(r))
    if r.collectives:
        parts.append(_collectives(r))
    for note in r.notes:
        parts.append(Text(f"Note: {note}", style="dim"))
    return Group(*parts)


def heatmap_data(r: RanksReport) -> dict[str, Any]:
    """Ranks × steps of busy and step times (ms) for the HTML heat map."""
    ranks = [row.rank for row in r.ranks]
    return {
        "ranks": ranks,
        "steps": [s.step for s in r.steps],
        "busy_ms": [[s.busy_ns[str(k)] / 1e6 for s in r.steps] for k in ranks],
        "step_ms": [[s.step_ns[str(k)] / 1e6 for s in r.steps] for k in ranks],
        "stragglers": [
            {"rank": s.rank, "step": s.step, "phase": s.phase, "late_ms": s.late_ns / 1e6}
            for s in r.stragglers
        ],
    }
