"""Which rank is slow, since when, in which phase: queries over the step tables of a job.

DIR holds the step tables written by ``profile(step_tables=DIR)`` or ``stepscope run
--step-tables DIR`` (``DIR/run=<run>/rank=<rank>/*.parquet``); DuckDB reads them in place.
The report names the rank the others waited for at collectives, since which step, in which
phase (data, optimizer, GC, compute, host) and how many ranks waited how long for it; per step,
the rank that lagged the others most; and how step times drifted over the run.  ``--sql`` runs
your own query over the view ``steps`` (every column of docs/step-tables.md, with ``run`` and
``rank``).

Only ``*.parquet`` files under ``run=NAME/rank=N`` directories (N in decimal digits) are read,
each by its own name; a damaged file, a directory whose rank is no number and a row found in
two files (a copied part) are left out or counted once, and a note says so.
"""

from __future__ import annotations

import argparse
import sys

from stepscope.atomic import atomic_output
from stepscope.commands.command import Command
from stepscope.jsonenc import json_bytes

__all__ = ["COMMAND", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``stepscope fleet``."""
    parser.add_argument("path", metavar="DIR", help="directory of step tables")
    parser.add_argument(
        "--sql", metavar="QUERY", help="run QUERY over the view 'steps' and print its rows"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    parser.add_argument("--html", metavar="FILE", help="also write the report as HTML")


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope fleet``."""
    from stepscope.report.fleet import render_fleet, render_rows, write_fleet_html
    from stepscope.report.terminal import report_console
    from stepscope.steptables.fleet import connect, fleet_report, run_sql
    from stepscope.text import printable

    tables = connect(args.path)
    console = report_console()
    if args.sql:
        if args.html:
            raise ValueError("--html draws the fleet report; it cannot be combined with --sql")
        columns, rows = run_sql(tables, args.sql)
        console.print(render_rows(columns, rows))
        for note in tables.notes:  # the rows are the query's: what was left out goes aside
            print(f"stepscope fleet: note: {printable(note)}", file=sys.stderr)
        document: object = {"columns": columns, "rows": [list(r) for r in rows]}
    else:
        report = fleet_report(args.path, tables)
        console.print(render_fleet(report))
        document = report.to_dict()
        if args.html:
            write_fleet_html(report, args.html)
            print(f"stepscope fleet: HTML -> {args.html}", file=sys.stderr)
    if args.json:
        with atomic_output(args.json, what="JSON fleet report") as fh:
            fh.write(json_bytes(document) + b"\n")
        print(f"stepscope fleet: JSON -> {args.json}", file=sys.stderr)
    return 0


COMMAND = Command("fleet", __doc__ or "", add_arguments, run)
"""``stepscope fleet``."""
