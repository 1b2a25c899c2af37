"""Summarise traces: step times, where each step's time went (host and device), top tables
and recommendations.

PATH is a trace file (.json or .json.gz, written by stepscope or torch.profiler) or a
directory of them (several windows or ranks: each file, then all together).  --json writes the
same numbers in the versioned ``stepscope.report`` schema (docs/report-schema.md); --markdown a
short summary with its evidence (for pull-request comments and agents).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stepscope.atomic import write_text
from stepscope.commands.command import Command
from stepscope.text import one_line
from stepscope.trace.loading import load_traces, trace_inputs

if TYPE_CHECKING:
    from stepscope.analysis.result import Report

__all__ = ["COMMAND", "add_arguments", "replaced_note", "run"]

ALL_ROWS = 1_000_000
"""``top`` that keeps every row (the Parquet tables hold them all)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``stepscope report``."""
    parser.add_argument("path", metavar="PATH", help="trace file or directory of traces")
    parser.add_argument("--steps", metavar="N-M", help="analyse only steps N to M (inclusive)")
    parser.add_argument("--top", type=int, default=10, metavar="K", help="rows per table (10)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--html", metavar="FILE", help="also write the report as HTML")
    parser.add_argument(
        "--markdown", metavar="FILE", help="also write a short Markdown summary (for PR comments)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="analyse the files in N processes (the same report as one; default 1)",
    )
    parser.add_argument(
        "--engine",
        default="processes",
        metavar="ENGINE",
        help="where the files are analysed: 'processes' (--jobs of them, the default) or "
        "'ray[:ADDRESS]' (tasks on an existing Ray cluster; pip install 'stepscope[ray]')",
    )
    parser.add_argument(
        "--parquet",
        metavar="DIR",
        help="also write the analysis tables (every row) as Parquet files into DIR",
    )


def replaced_note(replaced: int) -> str:
    """`` (N ... replaced)`` for an output line, "" when nothing was."""
    if not replaced:
        return ""
    return f" ({replaced} unpaired surrogate{'s' if replaced != 1 else ''} replaced by U+FFFD)"


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope report``."""
    from stepscope.analysis.analyze import analyze
    from stepscope.analysis.steps import parse_step_range

    if args.top < 1:
        raise ValueError(f"--top must be 1 or more, got {args.top}")
    step_range = parse_step_range(args.steps) if args.steps else None
    if args.jobs != 1 or args.engine != "processes":
        return _run_mapped(args, step_range)
    from stepscope.report.progress import reading_bar

    traces, failures = load_traces(Path(args.path), sys.stderr, progress=reading_bar(sys.stderr))
    # --parquet writes every row: analyse once with all of them, and show the top ones
    flames = bool(args.html)  # keep the stacks of the HTML page's flame graphs
    full = analyze(traces, step_range, ALL_ROWS, failures, flames=flames) if args.parquet else None
    report = (
        full.cut(args.top)
        if full
        else analyze(traces, step_range, args.top, failures, flames=flames)
    )
    for failure in failures:
        print(f"stepscope report: skipped {one_line(failure)}", file=sys.stderr)
    analysed = {s.source for s in report.files}
    traces = [(label, t) for label, t in traces if label in analysed]
    render_report_to(report)
    write_outputs(args, report)
    if args.html:
        from stepscope.report.html import write_html

        write_html(report, args.html)
        print(f"stepscope report: HTML -> {args.html}", file=sys.stderr)
    if args.parquet:
        from stepscope.report.parquet import write_parquet

        _, replaced = write_parquet(
            full or report, traces, args.parquet, run=Path(args.path).resolve().name
        )
        print(
            f"stepscope report: Parquet tables -> {args.parquet}{replaced_note(replaced)}",
            file=sys.stderr,
        )
    return 1 if failures else 0


def _run_mapped(args: argparse.Namespace, step_range: tuple[int, int] | None) -> int:
    """``report --jobs N`` / ``--engine ray``: each file analysed in a worker, joined here."""
    from stepscope.analysis.analyze import FileAnalysis, combine
    from stepscope.commands.report_map import map_files

    if args.jobs < 1:
        raise ValueError(f"--jobs must be 1 or more, got {args.jobs}")
    if args.html or args.parquet:
        raise ValueError("--html and --parquet need the traces here: leave out --jobs/--engine")
    path = Path(args.path)
    files = trace_inputs(path, sys.stderr)
    labelled = [(f, f.name if path.is_file() else str(f.relative_to(path))) for f in files]
    results = map_files(labelled, step_range, args.top, jobs=args.jobs, engine=args.engine)
    parts = [r for r in results if isinstance(r, FileAnalysis)]
    failures = [r for r in results if isinstance(r, str)]
    if not parts:
        raise ValueError(f"{path}: none of its {len(files)} files could be read: {failures[0]}")
    for failure in failures:
        print(f"stepscope report: skipped {one_line(failure)}", file=sys.stderr)
    report = combine(parts)
    render_report_to(report)
    write_outputs(args, report)
    return 1 if failures else 0


def write_outputs(args: argparse.Namespace, report: Report) -> None:
    """The report's ``--json`` and ``--markdown`` files, when asked for."""
    from stepscope.analysis.result import json_text

    if args.json:
        text, replaced = json_text(report.to_dict())
        write_text(args.json, text + "\n", "JSON report")
        print(f"stepscope report: JSON -> {args.json}{replaced_note(replaced)}", file=sys.stderr)
    if args.markdown:
        from stepscope.report.markdown import report_markdown

        replaced = write_text(args.markdown, report_markdown(report), "Markdown summary")
        print(
            f"stepscope report: Markdown -> {args.markdown}{replaced_note(replaced)}",
            file=sys.stderr,
        )


def render_report_to(report: Report) -> None:
    """Render on stdout (import kept local: rich loads only for this command)."""
    from stepscope.report.terminal import render_report, report_console

    render_report(report, report_console())


COMMAND = Command("report", __doc__ or "", add_arguments, run)
"""``stepscope report``."""
