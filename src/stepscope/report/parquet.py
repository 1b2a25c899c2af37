"""The analysis tables as Parquet files, for DuckDB / Spark / Dask across many runs and ranks.

``write_parquet(report, traces, directory, run)`` writes one file per table, one row per
(file, ...) with ``run``, ``rank`` (null when unknown) and ``file`` columns, so the files of many
runs can be read together (``read_parquet('runs/*/steps.parquet')`` in DuckDB); it returns the
paths and how many unpaired surrogates in text cells (a trace's names can hold them) were
written as U+FFFD:

- ``steps``: step number, start and duration (ns)
- ``breakdowns``: per step, host time by category (ns)
- ``ops``: CPU operators (calls, self and total ns)
- ``kernels``: device kernels (type, calls, total / mean / max ns)
- ``ranks``: the cross-rank table (computation / communication / idle, waiting, clock offset)
- ``collective_waits``: waiting time per collective and rank
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stepscope.analysis.result import Report
from stepscope.atomic import atomic_outputs, make_directory
from stepscope.extras import require
from stepscope.text import valid_text
from stepscope.trace.merge import rank_of
from stepscope.trace.model import Trace

__all__ = ["TABLES", "write_parquet"]

TABLES = ("steps", "breakdowns", "ops", "kernels", "ranks", "collective_waits")


def _rows(report: Report, traces: Sequence[tuple[str, Trace]], run: str) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {name: [] for name in TABLES}
    for (label, trace), s in zip(traces, report.files, strict=True):
        who = {"run": run, "rank": rank_of(trace, label), "file": label}
        for st in s.steps:
            rows["steps"].append(
                {**who, "step": st.step, "start_ns": st.start_ns, "dur_ns": st.dur_ns}
            )
        for hb in s.host_steps:
            for c in hb.categories:
                rows["breakdowns"].append({**who, "step": hb.step, "category": c.name, "ns": c.ns})
        for op in s.operators:
            rows["ops"].append(
                {
                    **who,
                    "name": op.name,
                    "category": op.category,
                    "calls": op.calls,
                    "self_ns": op.self_ns,
                    "total_ns": op.total_ns,
                }
            )
        for k in s.kernels:
            rows["kernels"].append(
                {
                    **who,
                    "name": k.name,
                    "kernel_type": k.kernel_type,
                    "calls": k.calls,
                    "total_ns": k.total_ns,
                    "mean_ns": k.mean_ns,
                    "max_ns": k.max_ns,
                }
            )
    if report.ranks is not None:
        for r in report.ranks.ranks:
            rows["ranks"].append({
                "run": run, "rank": r.rank, "steps": r.steps,
                "step_median_ns": r.step_median_ns, "total_ns": r.total_ns,
                "computation_ns": r.computation_ns, "communication_ns": r.communication_ns,
                "idle_ns": r.idle_ns, "collective_wait_ns": r.collective_wait_ns,
                "late_ns": r.late_ns, "clock_offset_ns": r.clock_offset_ns,
                "clock_uncertainty_ns": r.clock_uncertainty_ns,
            })  # fmt: skip
        for w in report.ranks.collectives:
            for rank, ns in w.wait_ns.items():
                rows["collective_waits"].append({
                    "run": run, "rank": int(rank), "collective": w.collective,
                    "group": w.group, "nelems": w.nelems, "dtype": w.dtype,
                    "calls": w.calls, "wait_ns": ns,
                })  # fmt: skip
    return rows


_SCHEMAS: dict[str, list[tuple[str, str]]] = {
    "steps": [("step", "int64"), ("start_ns", "int64"), ("dur_ns", "int64")],
    "breakdowns": [("step", "int64"), ("category", "string"), ("ns", "int64")],
    "ops": [("name", "string"), ("category", "string"), ("calls", "int64"),
            ("self_ns", "int64"), ("total_ns", "int64")],
    "kernels": [("name", "string"), ("kernel_type", "string"), ("calls", "int64"),
                ("total_ns", "int64"), ("mean_ns", "float64"), ("max_ns", "int64")],
    "ranks": [("steps", "int64"), ("step_median_ns", "int64"), ("total_ns", "int64"),
              ("computation_ns", "int64"), ("communication_ns", "int64"), ("idle_ns", "int64"),
              ("collective_wait_ns", "int64"), ("late_ns", "int64"),
              ("clock_offset_ns", "int64"), ("clock_uncertainty_ns", "int64")],
    "collective_waits": [("collective", "string"), ("group", "string"), ("nelems", "int64"),
                         ("dtype", "string"), ("calls", "int64"), ("wait_ns", "int64")],
}  # fmt: skip


def write_parquet(
    report: Report,
    traces: Sequence[tuple[str, Trace]],
    directory: str | os.PathLike[str],
    run: str,
) -> tuple[list[Path], int]:
    """Write the tables of ``report`` as ``<directory>/<table>.parquet``; returns the paths and
    how many characters of text cells were replaced (see the module's docstring)."""
    pa = require("pyarrow", "stepscope report --parquet", "parquet")
    pq = require("pyarrow.parquet", "stepscope report --parquet", "parquet")
    tables = {}
    replaced = 0
    for name, rows in _rows(report, traces, run).items():
        for row in rows:
            for column, value in row.items():
                if isinstance(value, str):
                    row[column], n = valid_text(value)
                    replaced += n
        who = [("run", "string")]
        if name not in ("ranks", "collective_waits"):
            who += [("rank", "int64"), ("file", "string")]
        else:
            who += [("rank", "int64")]
        fields = who + _SCHEMAS[name]
        schema = pa.schema([(col, getattr(pa, kind)()) for col, kind in fields])
        try:
            tables[name] = pa.Table.from_pylist(rows, schema=schema)
        except (OverflowError, pa.ArrowException) as exc:
            raise ValueError(
                f"--parquet: table {name!r} has a value its column cannot hold ({exc}); "
                f"nothing was written to {str(directory)!r} (the JSON report holds any value)"
            ) from None
    out = make_directory(directory, "--parquet")
    paths = [out / f"{name}.parquet" for name in tables]
    # every table lands, or none does: a full disk never mixes two runs' tables in one directory
    with atomic_outputs(paths, what="Parquet table") as files:
        for table, fh in zip(tables.values(), files, strict=True):
            pq.write_table(table, fh)
    for stale in _SCHEMAS.keys() - tables.keys():  # an earlier run's table this run has not
        (out / f"{stale}.parquet").unlink(missing_ok=True)
    return paths, replaced
