"""A short Markdown summary of a ``Report`` or ``DiffResult``, with its evidence: for
pull-request comments and for agents reading results.

Text from a trace (operator, kernel and file names) is escaped so it can neither break a table
nor become markup or a link.
"""

from __future__ import annotations

import re

from stepscope.analysis.result import DiffResult, Report, TraceSummary
from stepscope.report.data_workers import data_workers_markdown
from stepscope.report.labels import fit_label, steps_across_ranks
from stepscope.report.overhead import overhead_lines

__all__ = ["diff_markdown", "escape", "report_markdown"]

_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~])")


def escape(text: str) -> str:
    """``text`` as literal Markdown inline text (one line, every special character escaped)."""
    return _SPECIAL.sub(r"\\\1", " ".join(text.split()))


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _summary(s: TraceSummary, top: int, per_rank: list[int] | None = None) -> list[str]:
    st = s.step_stats
    whole = "" if s.has_steps else " (no ProfilerStep spans: the whole trace as one step)"
    counted = steps_across_ranks(st.count, per_rank or [])
    out = [
        f"**{counted}**{whole}: median {_ms(st.median_ns)} ms, p95 {_ms(st.p95_ns)} ms, "
        f"min {_ms(st.min_ns)} ms, max {_ms(st.max_ns)} ms.",
    ]
    if st.slowest:
        listed = ", ".join(
            f"#{t.step} {_ms(t.dur_ns)} ms" if t.step is not None else f"{_ms(t.dur_ns)} ms"
            for t in st.slowest
        )
        out.append(f"Slowest: {listed}.")
    n = max(1, st.count)
    shown = [c for c in s.host_total.categories if c.ns]
    if shown:
        out += ["", "Host time per step:", ""]
        out += _table(
            ["category", "ms / step", "%"],
            [[c.name, _ms(c.ns / n), f"{c.pct:.1f}"] for c in shown],
        )
    for d in s.devices:
        out.append(
            f"\nDevice {escape(d.device)}: compute {d.compute_pct:.1f}%, non-compute "
            f"{d.non_compute_pct:.1f}%, idle {d.idle_pct:.1f}% of {_ms(d.span_ns)} ms."
        )
    if s.operators:
        out += ["", f"Top operators (self time, of {st.count} steps):", ""]
        out += _table(
            ["operator", "calls", "self ms", "% of steps"],
            [
                [escape(r.name), str(r.calls), _ms(r.self_ns), f"{r.self_pct:.1f}"]
                for r in s.operators[:top]
            ],
        )
    if s.kernels:
        out += ["", "Top kernels:", ""]
        out += _table(
            ["kernel", "calls", "total ms"],
            [[escape(r.name[:80]), str(r.calls), _ms(r.total_ns)] for r in s.kernels[:top]],
        )
    out += data_workers_markdown(s.data_workers, escape)
    out.append("")
    out += [line for line in overhead_lines(s.overhead)]
    if s.recommendations:
        out += ["", "Recommendations:", ""]
        for r in s.recommendations:
            evidence = ", ".join(
                f"{escape(str(k))}={escape(str(v))}" for k, v in r.evidence.items()
            )
            out.append(f"- **{escape(r.title)}** ({evidence}): {escape(r.advice)}")
    else:
        out += ["", "Recommendations: none of the rules fired."]
    if s.dropped:
        out.append("\nDropped: " + ", ".join(f"{escape(k)} {v}" for k, v in s.dropped.items()))
    for note in s.notes:
        out.append(f"\n_Note: {escape(note)}_")
    return out


def report_markdown(report: Report, top: int = 5) -> str:
    """The report's short summary (all files together) as Markdown."""
    lines = [f"### stepscope report: {escape(report.combined.source)}", ""]
    if len(report.files) > 1:
        lines += [
            f"{len(report.files)} files: " + ", ".join(escape(f.source) for f in report.files),
            "",
        ]
    per_rank = [r.steps for r in report.ranks.ranks] if report.ranks is not None else None
    lines += _summary(report.combined, top, per_rank)
    return "\n".join(lines) + "\n"


def diff_markdown(diff: DiffResult, top: int = 10) -> str:
    """The diff's median step, categories and largest changes as Markdown."""
    s = diff.step
    noise = " (within the spread of the steps)" if s.within_noise else ""
    lines = [
        f"### stepscope diff: {escape(diff.b_source)} against {escape(diff.a_source)}",
        "",
        f"Median step {_ms(s.a_median_ns)} ms → {_ms(s.b_median_ns)} ms ({s.pct:+.1f}%){noise}.",
        "",
    ]
    lines += _table(
        ["category", "A ms / step", "B ms / step", "change %"],
        [
            [r.name, _ms(r.a_ns), _ms(r.b_ns), "new" if r.pct is None else f"{r.pct:+.1f}"]
            for r in diff.categories
            if r.a_ns or r.b_ns
        ],
    )
    changed = [r for r in diff.rows if r.status != "same"][:top]
    if changed:
        lines += ["", "Largest changes (per step):", ""]
        lines += _table(
            ["kind", "name", "status", "A ms", "B ms", "% of step"],
            [
                [
                    r.kind,
                    escape(fit_label(r.name, 80)),
                    r.status,
                    _ms(r.a_ns),
                    _ms(r.b_ns),
                    f"{r.impact_pct:+.2f}",
                ]
                for r in changed
            ],
        )
    lines += [f"\n_Note: {escape(n)}_" for n in diff.notes]
    return "\n".join(lines) + "\n"
