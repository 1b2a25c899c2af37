"""``diff_summaries``: run B against run A, per step, per category and per row.

Times are compared per step (a row's total divided by the run's number of steps), so runs with
different step counts compare.  A row is ``slower``/``faster`` when it changed by more than
1 % of itself and 1 µs per step, else ``same``; ``added``/``removed`` when one run lacks it.
Rows are sorted by impact: the change as a share of A's median step.  The median step's change
is *within noise* when it is no larger than the steps' spread (the larger of A's and B's
p95 minus median).
"""

from __future__ import annotations

from stepscope.analysis.result import DiffResult, DiffRow, StepDiff, TraceSummary

__all__ = ["diff_summaries"]

_MIN_CHANGE_NS = 1000.0
_MIN_CHANGE_SHARE = 0.01


def _status(a: float, b: float) -> str:
    if a == 0 and b > 0:
        return "added"
    if b == 0 and a > 0:
        return "removed"
    delta = b - a
    if abs(delta) <= max(_MIN_CHANGE_NS, _MIN_CHANGE_SHARE * a):
        return "same"
    return "slower" if delta > 0 else "faster"


def _row(kind: str, name: str, a: float, b: float, median: int) -> DiffRow:
    delta = b - a
    return DiffRow(
        kind,
        name,
        _status(a, b),
        a,
        b,
        delta,
        100.0 * delta / a if a else None,
        100.0 * delta / median if median else 0.0,
    )


def diff_summaries(a: TraceSummary, b: TraceSummary) -> DiffResult:
    """Compare B with A."""
    sa, sb = a.step_stats, b.step_stats
    na, nb = max(1, sa.count), max(1, sb.count)
    delta = sb.median_ns - sa.median_ns
    noise = max(sa.p95_ns - sa.median_ns, sb.p95_ns - sb.median_ns)
    step = StepDiff(
        sa.median_ns,
        sb.median_ns,
        delta,
        100.0 * delta / sa.median_ns if sa.median_ns else 0.0,
        sa.count,
        sb.count,
        noise,
        abs(delta) <= noise,
    )
    median = sa.median_ns
    cat_a = {c.name: c.ns / na for c in a.host_total.categories}
    cat_b = {c.name: c.ns / nb for c in b.host_total.categories}
    categories = [
        _row("category", name, cat_a.get(name, 0.0), cat_b.get(name, 0.0), median)
        for name in dict.fromkeys([*cat_a, *cat_b])
    ]
    rows: list[DiffRow] = []
    tables = (
        (
            "operator",
            {r.name: r.self_ns for r in a.operators},
            {r.name: r.self_ns for r in b.operators},
        ),
        (
            "kernel",
            {r.name: r.total_ns for r in a.kernels},
            {r.name: r.total_ns for r in b.kernels},
        ),
        (
            "function",
            {r.name: r.self_ns for r in a.functions},
            {r.name: r.self_ns for r in b.functions},
        ),
    )
    for kind, ra, rb in tables:
        for name in dict.fromkeys([*ra, *rb]):
            rows.append(_row(kind, name, ra.get(name, 0) / na, rb.get(name, 0) / nb, median))
    rows.sort(key=lambda r: (-abs(r.delta_ns), r.kind, r.name))
    notes = []
    if step.within_noise:
        notes.append(
            f"the median step changed by {delta / 1e6:+.3f} ms, within the spread of the steps "
            f"({noise / 1e6:.3f} ms): it may be noise"
        )
    if sa.count < 3 or sb.count < 3:
        notes.append("fewer than 3 steps in a run: the spread of the steps is poorly known")
    notes.append("operator, kernel and function rows cover each run's top rows (--top)")
    return DiffResult(a.source, b.source, step, categories, rows, notes)
