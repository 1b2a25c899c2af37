"""``diff_summaries``: run B against run A, per step, per category and per row.

Times are compared per step (a row's total divided by the run's number of steps), so runs with
different step counts compare.  A row is ``slower``/``faster`` when it changed by more than
1 % of itself and 1 µs per step, else ``same``; ``added``/``removed`` when one run lacks it.
Rows are sorted by impact: the change as a share of A's median step.  Categories are means per
step (they add up to the mean step, shown beside the median).  Whether the step's change is
beyond the run-to-run spread comes from ``analysis.noise``; a step change *within noise* is not.
A script renamed between the runs keeps its functions: a function of a file only A has and one
of the same name in a file only B has are one row, named with both files.
"""

from __future__ import annotations

import re
from collections import Counter

from stepscope.analysis.noise import CONFIDENCE, step_change
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


_SAMPLED = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*)\)$")
"""A sampled function: ``name (path/file.py)``."""
_TRACED = re.compile(r"^(?P<file>[^()]*)\(\d+\): (?P<name>.*)$")
"""A traced function (torch's form): ``path/file.py(12): name``."""
UNNAMED = "(unnamed function)"


def _function_file(label: str) -> tuple[str, str] | None:
    m = _SAMPLED.match(label) or _TRACED.match(label)
    return (m.group("name"), m.group("file")) if m else None


def _pair_renamed(
    ra: dict[str, float], rb: dict[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """A's and B's function rows, re-keyed to one name where only the file was renamed.

    A file is renamed when A's rows name it and B's do not, and the other way round; a
    function pairs when its name is unique among those files' functions on both sides.
    """
    parsed_a = {k: f for k in ra if (f := _function_file(k))}
    parsed_b = {k: f for k in rb if (f := _function_file(k))}
    files_a = {f for _, f in parsed_a.values()}
    files_b = {f for _, f in parsed_b.values()}
    only_a = {k: n for k, (n, f) in parsed_a.items() if f not in files_b}
    only_b = {k: n for k, (n, f) in parsed_b.items() if f not in files_a}
    count_a, count_b = Counter(only_a.values()), Counter(only_b.values())
    by_name_a = {n: k for k, n in only_a.items() if count_a[n] == 1}
    out_a, out_b = dict(ra), dict(rb)
    for key_b, name in only_b.items():
        key_a = by_name_a.get(name)
        if key_a is None or count_b[name] != 1:
            continue
        (_, file_a), (_, file_b) = parsed_a[key_a], parsed_b[key_b]
        renamed = key_a.replace(file_a, f"{file_a} -> {file_b}", 1)
        out_a[renamed] = out_a.pop(key_a)
        out_b[renamed] = out_b.pop(key_b)
    return out_a, out_b


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
    change = step_change([s.dur_ns for s in a.steps], [s.dur_ns for s in b.steps])
    step = StepDiff(
        sa.median_ns,
        sb.median_ns,
        delta,
        100.0 * delta / sa.median_ns if sa.median_ns else 0.0,
        sa.count,
        sb.count,
        change.drift_ns,
        not change.beyond_spread,
        round(sa.mean_ns),
        round(sb.mean_ns),
        change.shift_ns,
        change.low_ns,
        change.high_ns,
    )
    median = sa.median_ns
    cat_a = {c.name: c.ns / na for c in a.host_total.categories}
    cat_b = {c.name: c.ns / nb for c in b.host_total.categories}
    categories = [
        _row("category", name, cat_a.get(name, 0.0), cat_b.get(name, 0.0), median)
        for name in dict.fromkeys([*cat_a, *cat_b])
    ]
    rows: list[DiffRow] = []
    tables: tuple[tuple[str, dict[str, float], dict[str, float]], ...] = (
        (
            "operator",
            {r.name: float(r.self_ns) for r in a.operators},
            {r.name: float(r.self_ns) for r in b.operators},
        ),
        (
            "kernel",
            {r.name: float(r.total_ns) for r in a.kernels},
            {r.name: float(r.total_ns) for r in b.kernels},
        ),
    )
    fa = {r.name or UNNAMED: float(r.self_ns) for r in a.functions}
    fa, fb = _pair_renamed(fa, {r.name or UNNAMED: float(r.self_ns) for r in b.functions})
    tables += (("function", fa, fb),)
    for kind, ra, rb in tables:
        for name in dict.fromkeys([*ra, *rb]):
            rows.append(_row(kind, name, ra.get(name, 0) / na, rb.get(name, 0) / nb, median))
    rows.sort(key=lambda r: (-abs(r.delta_ns), r.kind, r.name))
    notes = []
    if not change.known:
        notes.append("fewer than 3 steps in a run: the spread of the steps is not known")
    elif step.within_noise:
        notes.append(
            f"the step change ({change.shift_ns / 1e6:+.3f} ms, {CONFIDENCE:.0%} interval "
            f"{change.low_ns / 1e6:+.3f} to {change.high_ns / 1e6:+.3f} ms; drift within a run "
            f"{change.drift_ns / 1e6:.3f} ms) is within the run-to-run spread: it may be noise"
        )
    notes.append("categories are means per step: they add up to the mean step, not the median")
    notes.append("operator, kernel and function rows cover each run's top rows (--top)")
    return DiffResult(a.source, b.source, step, categories, rows, notes)
