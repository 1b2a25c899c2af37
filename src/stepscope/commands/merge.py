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

from stepscope.commands.command import Command
from stepscope.commands.report import load_traces
from stepscope.trace.chrome_writer import write_chrome_trace
from stepscope.trace.merge import merge_ranks, rank_in_name, rank_of

__all__ = ["COMMAND", "add_arguments", "parse_ranks", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``stepscope merge``."""
    parser.add_argument("path", metavar="DIR", help="directory of per-rank trace files")
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="merged trace (.json or .json.gz)"
    )
    parser.add_argument(
        "--ranks",
        metavar="LIST",
        help="only these ranks, e.g. 0,7,12-15 (at thousands of ranks: the straggler and a few)",
    )


def parse_ranks(text: str) -> set[int]:
    """``0,7,12-15`` -> {0, 7, 12, 13, 14, 15}; ``ValueError`` saying what is wrong."""
    found: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"--ranks: {part.strip()!r} is not a rank or a range N-M (e.g. 0,4-7)")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError(f"--ranks: range {part.strip()!r} ends before it starts")
        found.update(range(first, last + 1))
    return found


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope merge``."""
    if not args.output.endswith((".json", ".json.gz")):
        raise ValueError(f"--output must end in .json or .json.gz, got {args.output!r}")
    wanted = parse_ranks(args.ranks) if args.ranks else None
    keep = None
    if wanted is not None:
        chosen = wanted

        def keep(path: Path) -> bool:  # a file named for another rank is not even read
            named = rank_in_name(path.name)
            return named is None or named in chosen

    try:
        traces, failures = load_traces(Path(args.path), sys.stderr, keep)
    except ValueError as exc:
        if wanted is None or "was chosen" not in str(exc):
            raise
        raise ValueError(f"{args.path}: no trace of rank(s) {args.ranks}") from None
    for failure in failures:
        print(f"stepscope merge: skipped {failure}", file=sys.stderr)
    if wanted is not None:
        traces = [(label, t) for label, t in traces if rank_of(t, label) in wanted]
        if not traces:
            raise ValueError(f"{args.path}: no trace of rank(s) {args.ranks}")
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


COMMAND = Command("merge", __doc__ or "", add_arguments, run)
"""``stepscope merge``."""
