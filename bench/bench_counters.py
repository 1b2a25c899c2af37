"""Counters and metric tables beside torch._inductor.metrics (what they re-create), in one run.

Cases: a counter increment (stepscope's thread-safe ``CounterSet.inc`` vs inductor's module-global
``metrics.x += 1``, which is not thread-safe, and vs a lock-guarded dict); ``add_row`` on a
disabled table (the cost every call site pays when tables are off); snapshot + delta + apply
vs ``CachedMetricsHelper``; and ``add_row`` on an enabled table (one CSV line appended).
The issue states no speed target; the targets below are ours: a disabled ``add_row`` costs no
more than inductor's, and a thread-safe increment costs less than the simplest thread-safe
alternative (a dict behind a lock).  The ratio to inductor's bare global (unsafe) is reported.
"""

from __future__ import annotations

import tempfile
import threading
from typing import Any

from harness import Report
from stepscope.config import config
from stepscope.counters import CounterSet
from stepscope.tables import MetricTable

N_INC = 200_000
N_ROWS_DISABLED = 200_000
N_ROWS_ENABLED = 5_000
N_DELTA = 20_000


def torch_metrics() -> Any | None:
    """torch._inductor.metrics, or None when torch is not installed."""
    try:
        from torch._inductor import metrics
    except ImportError:
        return None
    return metrics


def run(report: Report) -> None:
    """Measure every case for stepscope and, where torch is installed, for inductor."""
    scale = 10 if report.quick else 1
    repeat = 3 if report.quick else 7
    n_inc, n_rows, n_enabled, n_delta = (
        N_INC // scale,
        N_ROWS_DISABLED // scale,
        N_ROWS_ENABLED // scale,
        N_DELTA // scale,
    )
    metrics = torch_metrics()

    # -- counter increment -------------------------------------------------------------------
    cs = CounterSet("bench", ["generated_kernel_count"])
    inc = cs.inc

    def ours_inc() -> None:
        for _ in range(n_inc):
            inc("generated_kernel_count")

    lock = threading.Lock()
    locked: dict[str, int] = {"generated_kernel_count": 0}

    def locked_inc() -> None:
        for _ in range(n_inc):
            with lock:
                locked["generated_kernel_count"] += 1

    ours = report.measure("counter inc", "stepscope CounterSet.inc", ours_inc, repeat=repeat,
                          per_call=n_inc)  # fmt: skip
    guarded = report.measure(
        "counter inc", "lock-guarded dict", locked_inc, repeat=repeat, per_call=n_inc
    )
    value = report.ratio("counter inc vs lock", ours, guarded)
    report.target("counter inc vs a lock-guarded dict (x)", value, 1.0)
    if metrics is not None:

        def inductor_inc() -> None:
            for _ in range(n_inc):
                metrics.generated_kernel_count += 1

        inductor = report.measure("counter inc", "inductor metrics global +=", inductor_inc,
                              repeat=repeat, per_call=n_inc)  # fmt: skip
        report.ratio("counter inc vs inductor (not thread-safe)", ours, inductor)

    # -- add_row on a disabled table -----------------------------------------------------------
    table = MetricTable.register_table("bench_table", ["a", "b"])

    def row() -> dict[str, str | float | None]:
        return {"a": "x", "b": 1.0}

    def ours_disabled() -> None:
        add = table.add_row
        for _ in range(n_rows):
            add(row)

    with config.patch(metric_tables=""):
        off = report.measure("add_row, table disabled", "stepscope", ours_disabled,
                             repeat=repeat, per_call=n_rows)  # fmt: skip
    if metrics is not None:
        inductor_table = metrics.get_metric_table("graph_stats")

        def inductor_disabled() -> None:
            add = inductor_table.add_row
            for _ in range(n_rows):
                add(row)

        inductor_off = report.measure("add_row, table disabled", "inductor metrics",
                                      inductor_disabled, repeat=repeat,
                                      per_call=n_rows)  # fmt: skip
        value = report.ratio("add_row disabled", off, inductor_off)
        report.target("disabled add_row vs inductor (x)", value, 1.0)

    # -- cached-metrics deltas ---------------------------------------------------------------
    fields = ["generated_kernel_count", "generated_cpp_vec_kernel_count", "ir_nodes_pre_fusion",
              "cpp_to_dtype_count", "num_bytes_accessed",
              "num_matches_for_scatter_upon_const_tensor"]  # fmt: skip
    deltas = CounterSet("bench_deltas", fields)

    def ours_delta() -> None:
        for _ in range(n_delta):
            before = deltas.snapshot()
            deltas.inc("generated_kernel_count")
            deltas.apply(deltas.delta(before))

    mine = report.measure("snapshot + delta + apply", "stepscope", ours_delta, repeat=repeat,
                          per_call=n_delta)  # fmt: skip
    if metrics is not None:
        helper_cls = metrics.CachedMetricsHelper

        def inductor_delta() -> None:
            for _ in range(n_delta):
                helper = helper_cls()
                metrics.generated_kernel_count += 1
                helper_cls.apply_deltas(helper.get_deltas())

        theirs = report.measure("snapshot + delta + apply", "inductor CachedMetricsHelper",
                                inductor_delta, repeat=repeat, per_call=n_delta)  # fmt: skip
        report.ratio("snapshot + delta + apply", mine, theirs)

    # -- add_row on an enabled table -----------------------------------------------------------
    with tempfile.TemporaryDirectory() as tmp:

        def ours_enabled() -> None:
            add = table.add_row
            for _ in range(n_enabled):
                add(row)

        with config.patch(metric_tables="bench_table", tables_dir=tmp, run_name="bench"):
            on = report.measure("add_row, table enabled (CSV line)", "stepscope", ours_enabled,
                                repeat=repeat, per_call=n_enabled)  # fmt: skip
            table.close()
        if metrics is not None:
            import os

            from torch._inductor import config as inductor_config

            cwd = os.getcwd()
            os.chdir(tmp)  # inductor writes its tables to the current directory
            try:
                with inductor_config.patch(enabled_metric_tables="graph_stats"):
                    inductor_table = metrics.get_metric_table("graph_stats")

                    def inductor_row() -> dict[str, str | float | None]:
                        return {
                            "graph_id": "x",
                            "num_nodes_before_fusion": 1.0,
                            "num_nodes_after_fusion": 2.0,
                        }

                    def inductor_enabled() -> None:
                        for _ in range(n_enabled):
                            inductor_table.add_row(inductor_row)

                    inductor_on = report.measure("add_row, table enabled (CSV line)",
                                             "inductor metrics", inductor_enabled, repeat=repeat,
                                             per_call=n_enabled)  # fmt: skip
                    report.ratio("add_row enabled", on, inductor_on)
            finally:
                os.chdir(cwd)
    if metrics is None:
        report.note("torch is not installed: inductor's numbers are missing")
