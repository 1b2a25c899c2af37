"""Step metrics and the report's summary logged to an MLflow run.

``log_report(report)`` logs, into the active run (or ``run_id``): the step time of every
analysed step (``stepscope.step_ms``, at the step's number) and its host categories
(``stepscope.host.<category>_ms``), run-level figures (median and p95 step, each category's
share, device idle, the stated overhead), and two artifacts: the Markdown summary and the
report's JSON.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from stepscope.analysis.result import Report
from stepscope.extras import require
from stepscope.report.markdown import report_markdown
from stepscope.text import clean_text

__all__ = ["log_report", "report_metrics", "step_metrics"]

BATCH = 1000
"""Metrics per ``log_batch`` call (MLflow's limit)."""


def report_metrics(report: Report, prefix: str = "stepscope") -> dict[str, float]:
    """The run-level figures, by metric name."""
    s = report.combined
    found = {
        f"{prefix}.steps": float(s.step_stats.count),
        f"{prefix}.step_median_ms": s.step_stats.median_ns / 1e6,
        f"{prefix}.step_p95_ms": s.step_stats.p95_ns / 1e6,
    }
    for c in s.host_total.categories:
        found[f"{prefix}.host.{c.name}_pct"] = c.pct
    for d in s.devices:
        if d.device == "all" or len(s.devices) == 1:
            found[f"{prefix}.device_idle_pct"] = d.idle_pct
    if s.overhead is not None and s.overhead.slowdown_pct is not None:
        found[f"{prefix}.overhead_pct"] = s.overhead.slowdown_pct
    return found


def step_metrics(report: Report, prefix: str = "stepscope") -> list[tuple[str, float, int]]:
    """(name, value, step) of every analysed step: its time and host categories in ms."""
    found = []
    for t, b in zip(report.combined.steps, report.combined.host_steps, strict=False):
        if t.step is None:
            continue
        found.append((f"{prefix}.step_ms", t.dur_ns / 1e6, t.step))
        found += [(f"{prefix}.host.{c.name}_ms", c.ns / 1e6, t.step) for c in b.categories]
    return found


def log_report(
    report: Report | str | os.PathLike[str],
    run_id: str | None = None,
    prefix: str = "stepscope",
) -> str:
    """Log ``report`` (a ``Report``, or a trace file or directory to analyse) to the MLflow run
    ``run_id`` (default: the active run); returns the run id."""
    mlflow = require("mlflow", "stepscope.integrations.mlflow", "mlflow")
    if not isinstance(report, Report):
        from stepscope.integrations.notebook import load_report

        report = load_report(report).report
    if run_id is None:
        active = mlflow.active_run()
        if active is None:
            raise ValueError(
                "log_report: no active MLflow run; call it inside mlflow.start_run() or pass "
                "run_id="
            )
        run_id = active.info.run_id
    entities: Any = mlflow.entities
    now = int(time.time() * 1000)
    metrics = [entities.Metric(k, v, now, 0) for k, v in report_metrics(report, prefix).items()]
    metrics += [entities.Metric(k, v, now, step) for k, v, step in step_metrics(report, prefix)]
    try:
        client = mlflow.MlflowClient()
        client.log_batch(run_id, metrics=metrics[:BATCH])
    except Exception as exc:
        hint = _store_hint(str(exc), str(mlflow.get_tracking_uri()))
        if hint is None:
            raise
        raise RuntimeError(f"log_report: {hint}") from exc
    for at in range(BATCH, len(metrics), BATCH):
        client.log_batch(run_id, metrics=metrics[at : at + BATCH])
    # valid UTF-8 (a trace's names can hold unpaired surrogates: U+FFFD, as `report` writes)
    client.log_text(run_id, clean_text(report_markdown(report)), f"{prefix}/summary.md")
    client.log_dict(run_id, json.loads(report.to_json(indent=None)), f"{prefix}/report.json")
    return str(run_id)


_FILE_STORE = (
    "a local file store needs MLFLOW_ALLOW_FILE_STORE=true in the environment with MLflow 3 "
    "(os.environ['MLFLOW_ALLOW_FILE_STORE'] = 'true' and "
    "mlflow.set_tracking_uri('file:./mlruns')), or log to a tracking server: "
    "mlflow.set_tracking_uri('http://host:5000')"
)


def _store_hint(message: str, uri: str) -> str | None:
    """What to do when MLflow could not open its tracking store ``uri``, or None when
    ``message`` is about something else."""
    if "MLFLOW_ALLOW_FILE_STORE" in message:
        return f"MLflow refused its tracking store {uri}: {_FILE_STORE}"
    database = uri.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql")
    if database and ("unsupported URI" in message or "sqlalchemy" in message.lower()):
        return (
            f"MLflow cannot open the database store {uri} (MLflow 3's default): that needs the "
            f"full mlflow package (pip install mlflow), not mlflow-skinny; else {_FILE_STORE}"
        )
    return None
