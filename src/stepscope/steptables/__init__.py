"""Step tables: one row per step per rank, written as Parquet while the job runs.

``profile(step_tables=DIR)`` records every step (recorded by the schedule or not) into a
preallocated buffer and hands each full row group to a background thread, which writes it as one
Parquet file under ``DIR/run=<run>/rank=<rank>/``.  ``stepscope fleet DIR`` queries them with
DuckDB (``fleet.py``).  The columns are in ``schema.py`` (docs/step-tables.md).
"""

from __future__ import annotations

from stepscope.steptables.recorder import NoStepTables, StepTables, step_tables_of
from stepscope.steptables.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "NoStepTables", "StepTables", "step_tables_of"]
