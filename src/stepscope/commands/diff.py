"""Compare two runs: median step, host categories, operators, kernels and functions.

A and B are trace files or directories (as for ``stepscope report``).  Times are per step.
The output says when the runs were recorded differently (steps, ranks, activities, versions,
machine) and whether the step change is beyond the run-to-run spread of the step times.

As a CI gate, --fail-if-slower [PCT] exits with status 1 when B's median step is more than
PCT % (default 0) slower than A's *and* the change is beyond the spread, and with status 3
when A or B has no complete steps to compare (nothing recorded, or only cut-short steps).
Each failure prints one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepscope.atomic import write_text
from stepscope.commands.command import Command
from stepscope.commands.report import replaced_note
from stepscope.text import one_line
from stepscope.trace.loading import load_traces

__all__ = ["COMMAND", "EXIT_NO_STEPS", "EXIT_SLOWER", "add_arguments", "run"]

ALL_ROWS = 1_000_000
EXIT_SLOWER = 1
"""The gate's status when B is slower beyond the limit and the spread."""
EXIT_NO_STEPS = 3
"""The gate's status when a run has no complete steps to compare."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``stepscope diff``."""
    parser.add_argument("a", metavar="A", help="baseline trace file or directory")
    parser.add_argument("b", metavar="B", help="trace file or directory to compare")
    parser.add_argument("--steps", metavar="N-M", help="compare only steps N to M of each run")
    parser.add_argument("--top", type=int, default=10, metavar="K", help="rows shown (10)")
    parser.add_argument(
        "--fail-if-slower",
        type=float,
        nargs="?",
        const=0.0,
        metavar="PCT",
        help="CI gate: exit 1 when B's median step is more than PCT %% (default 0) slower than "
        "A's beyond the run-to-run spread; exit 3 when A or B has no complete steps",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the diff as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope diff``."""
    from stepscope.analysis.analyze import analyze
    from stepscope.analysis.comparable import mismatches, run_facts
    from stepscope.analysis.diff import diff_summaries
    from stepscope.analysis.noise import MIN_STEPS
    from stepscope.analysis.steps import parse_step_range
    from stepscope.report.progress import reading_bar
    from stepscope.report.terminal import render_diff, report_console
    from stepscope.trace.merge import rank_of

    if args.top < 1:
        raise ValueError(f"--top must be 1 or more, got {args.top}")
    if args.fail_if_slower is not None and not args.fail_if_slower >= 0:
        raise ValueError(f"--fail-if-slower must be a percentage >= 0, got {args.fail_if_slower}")
    step_range = parse_step_range(args.steps) if args.steps else None
    gate = args.fail_if_slower is not None
    summaries = []
    facts = []
    rank_counts = []
    for side, path in (("A", args.a), ("B", args.b)):
        try:
            traces, failures = load_traces(Path(path), sys.stderr, progress=reading_bar(sys.stderr))
        except ValueError as exc:
            if not gate:
                raise
            return _no_steps(side, path, str(exc))
        summary = analyze(traces, step_range, ALL_ROWS, failures).combined
        for failure in failures:
            print(f"stepscope diff: skipped {one_line(failure)}", file=sys.stderr)
        if gate and (not summary.has_steps or summary.step_stats.count == 0):
            why = "only cut-short steps" if summary.has_steps else "no ProfilerStep spans"
            return _no_steps(side, path, why)
        summaries.append(summary)
        facts.append(run_facts(traces, summary))
        rank_counts.append(len({rank_of(t, label) for label, t in traces}))
    result = diff_summaries(summaries[0], summaries[1])
    result.mismatches = mismatches(facts[0], facts[1])
    if rank_counts[0] != rank_counts[1]:
        result.notes.append(
            f"A has files of {rank_counts[0]} rank(s), B of {rank_counts[1]}: each run's steps "
            "are pooled over its ranks, so the runs may not be comparable"
        )
    render_diff(result, report_console(), args.top)
    if args.json:
        from stepscope.analysis.result import json_text

        text, replaced = json_text(result.to_dict())
        write_text(args.json, text + "\n", "JSON diff")
        if replaced:
            print(f"stepscope diff: JSON -> {args.json}{replaced_note(replaced)}", file=sys.stderr)
    if not gate:
        return 0
    step = result.step
    if step.pct <= args.fail_if_slower:
        return 0
    if step.within_noise:
        few = step.a_steps < MIN_STEPS or step.b_steps < MIN_STEPS
        why = "too few steps to tell it from noise" if few else "within the run-to-run spread"
        print(
            f"stepscope diff: median step {step.pct:+.1f}% but {why}: the gate passes",
            file=sys.stderr,
        )
        return 0
    print(
        f"stepscope diff: median step {step.pct:+.1f}% slower than the baseline, over the "
        f"{args.fail_if_slower:g}% limit and beyond the run-to-run spread",
        file=sys.stderr,
    )
    return EXIT_SLOWER


def _no_steps(side: str, path: str, why: str) -> int:
    print(
        f"stepscope diff: {side} ({path}) has no complete steps to compare: {why}",
        file=sys.stderr,
    )
    return EXIT_NO_STEPS


COMMAND = Command("diff", __doc__ or "", add_arguments, run)
"""``stepscope diff``."""
