"""Compare two runs: median step, host categories, operators, kernels and functions.

A and B are trace files or directories (as for ``stepscope report``).  Times are per step.
--fail-if-slower PCT exits with status 1 when B's median step is more than PCT % slower than
A's (for CI); the output says when the change is within the spread of the steps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepscope.analysis.analyze import analyze
from stepscope.analysis.diff import diff_summaries
from stepscope.analysis.steps import parse_step_range
from stepscope.commands.command import Command
from stepscope.commands.report import load_traces, write_text
from stepscope.text import one_line
from stepscope.trace.merge import rank_of

__all__ = ["COMMAND", "add_arguments", "run"]

ALL_ROWS = 1_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``stepscope diff``."""
    parser.add_argument("a", metavar="A", help="baseline trace file or directory")
    parser.add_argument("b", metavar="B", help="trace file or directory to compare")
    parser.add_argument("--steps", metavar="N-M", help="compare only steps N to M of each run")
    parser.add_argument("--top", type=int, default=10, metavar="K", help="rows shown (10)")
    parser.add_argument(
        "--fail-if-slower",
        type=float,
        metavar="PCT",
        help="exit 1 when B's median step is more than PCT %% slower than A's",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the diff as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope diff``."""
    from stepscope.report.terminal import render_diff, report_console

    if args.top < 1:
        raise ValueError(f"--top must be 1 or more, got {args.top}")
    if args.fail_if_slower is not None and not args.fail_if_slower >= 0:
        raise ValueError(f"--fail-if-slower must be a percentage >= 0, got {args.fail_if_slower}")
    step_range = parse_step_range(args.steps) if args.steps else None
    summaries = []
    rank_counts = []
    for path in (args.a, args.b):
        traces, failures = load_traces(Path(path), sys.stderr)
        report = analyze(traces, step_range, ALL_ROWS, failures)
        for failure in failures:
            print(f"stepscope diff: skipped {one_line(failure)}", file=sys.stderr)
        summaries.append(report.combined)
        rank_counts.append(len({rank_of(t, label) for label, t in traces}))
    result = diff_summaries(summaries[0], summaries[1])
    if rank_counts[0] != rank_counts[1]:
        result.notes.append(
            f"A has files of {rank_counts[0]} rank(s), B of {rank_counts[1]}: each run's steps "
            "are pooled over its ranks, so the runs may not be comparable"
        )
    render_diff(result, report_console(), args.top)
    if args.json:
        write_text(args.json, result.to_json() + "\n", "JSON diff")
    if args.fail_if_slower is not None and result.step.pct > args.fail_if_slower:
        noise = " (within the spread of the steps)" if result.step.within_noise else ""
        print(
            f"stepscope diff: median step {result.step.pct:+.1f}% slower than the baseline, "
            f"over the {args.fail_if_slower:g}% limit{noise}",
            file=sys.stderr,
        )
        return 1
    return 0


COMMAND = Command("diff", __doc__ or "", add_arguments, run)
"""``stepscope diff``."""
