"""Merge the traces of every rank into one timeline: each rank its own processes, clocks aligned.

DIR holds the trace files of a distributed job (one or more windows per rank, as written by
stepscope under torchrun).  Each rank's processes become ``rank N · <name>`` with their own pids
and flow ids, and its times are shifted by the clock offset to rank 0 measured at the first
window.  The result opens in Perfetto or chrome://tracing and in ``stepscope report``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepscope.commands.report import load_traces
from stepscope.trace.chrome_writer import write_chrome_trace
from stepscope.trace.merge import merge_ranks

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``stepscope merge``."""
    parser.add_argument("path", metavar="DIR", help="directory of per-rank trace files")
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="merged trace (.json or .json.gz)"
    )


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope merge``."""
    if not args.output.endswith((".json", ".json.gz")):
        raise ValueError(f"--output must end in .json or .json.gz, got {args.output!r}")
    traces, failures = load_traces(Path(args.path), sys.stderr)
    for failure in failures:
        print(f"stepscope merge: skipped {failure}", file=sys.stderr)
    merged = merge_ranks(traces)
    write_chrome_trace(merged, args.output)
    ranks = merged.metadata["stepscope_merged_ranks"]
    unaligned = [r for r, info in ranks.items() if info["clock_offset_ns"] is None]
    note = f" (clocks not measured for rank {', '.join(unaligned)})" if unaligned else ""
    print(
        f"stepscope merge: {len(traces)} files of {len(ranks)} ranks -> {args.output}{note}",
        file=sys.stderr,
    )
    return 1 if failures else 0
