"""Merge the traces of every rank into one timeline: each rank its own processes, clocks aligned.

DIR holds the trace files of a distributed job (one or more windows per rank, as written by
stepscope under torchrun).  Each rank's processes become ``rank N · <name>`` with their own pids
and flow ids, and its times are shifted by the clock offset to rank 0 measured at the first
window.  The result opens in Perfetto or chrome://tracing and in ``stepscope report``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from stepscope.commands.command import Command
from stepscope.text import one_line
from stepscope.trace.chrome_writer import write_chrome_trace
from stepscope.trace.loading import load_traces
from stepscope.trace.merge import MAX_RANK, merge_ranks, rank_in_name, rank_of
from stepscope.trace.model import Trace

__all__ = ["COMMAND", "add_arguments", "claimed_twice", "parse_ranks", "run"]


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


MAX_CHOSEN = 1_000_000
"""The most ranks ``--ranks`` may name in all (the set is built in memory)."""


def parse_ranks(text: str) -> set[int]:
    """``0,7,12-15`` -> {0, 7, 12, 13, 14, 15}; ``ValueError`` saying what is wrong."""
    bounds: list[tuple[int, int]] = []
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"--ranks: {part.strip()!r} is not a rank or a range N-M (e.g. 0,4-7)")
        if len(lo) > 10 or len(hi) > 10 or max(int(lo), int(hi or 0)) > MAX_RANK:
            raise ValueError(
                f"--ranks: {part.strip()[:40]!r} is beyond the largest rank {MAX_RANK}"
            )
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError(f"--ranks: range {part.strip()!r} ends before it starts")
        bounds.append((first, last))
    named = sum(last - first + 1 for first, last in bounds)
    if named > MAX_CHOSEN:
        raise ValueError(
            f"--ranks: {text[:60]!r} names {named:,} ranks, more than {MAX_CHOSEN:,}; "
            "name the ranks to keep (e.g. the straggler and a few)"
        )
    return {rank for first, last in bounds for rank in range(first, last + 1)}


def _time_span(trace: Trace) -> tuple[int, int]:
    spans = trace.spans
    if not len(spans):
        return 0, 0
    starts, durs = spans["start_ns"], spans["dur_ns"]
    shift = trace.base_time_ns
    return shift + min(starts), shift + max(s + d for s, d in zip(starts, durs, strict=True))


def claimed_twice(traces: list[tuple[str, Trace]]) -> dict[int, list[str]]:
    """Ranks claimed by two files whose times overlap (one rank's windows never overlap)."""
    by_rank: dict[int, list[tuple[int, int, str]]] = {}
    for label, trace in traces:
        rank = rank_of(trace, label)
        if rank is not None:
            by_rank.setdefault(rank, []).append((*_time_span(trace), label))
    found: dict[int, list[str]] = {}
    for rank, windows in by_rank.items():
        windows.sort()
        clashing = {
            label
            for (_, end, first), (start, _, second) in itertools.pairwise(windows)
            if start < end
            for label in (first, second)
        }
        if clashing:
            found[rank] = sorted(clashing)
    return found


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope merge``."""
    from stepscope.report.progress import reading_bar

    if not args.output.endswith((".json", ".json.gz")):
        raise ValueError(f"--output must end in .json or .json.gz, got {args.output!r}")
    wanted = parse_ranks(args.ranks) if args.ranks else None
    output = Path(args.output).resolve()

    def keep_file(path: Path) -> bool:
        if path.resolve() == output:  # an earlier merge's output in DIR is not a rank's trace
            return False
        named = rank_in_name(path.name)  # a file named for another rank is not even read
        return wanted is None or named is None or named in wanted

    try:
        traces, failures = load_traces(
            Path(args.path), sys.stderr, keep_file, progress=reading_bar(sys.stderr)
        )
    except ValueError as exc:
        if wanted is None or "was chosen" not in str(exc):
            raise
        raise ValueError(f"{args.path}: no trace of rank(s) {args.ranks}") from None
    for failure in failures:
        print(f"stepscope merge: skipped {one_line(failure)}", file=sys.stderr)
    if wanted is not None:
        traces = [(label, t) for label, t in traces if rank_of(t, label) in wanted]
        if not traces:
            raise ValueError(f"{args.path}: no trace of rank(s) {args.ranks}")
    for rank, labels in claimed_twice(traces).items():
        print(
            f"stepscope merge: note: rank {rank} is claimed by files whose times overlap "
            f"({one_line(', '.join(labels))}): two runs in one directory? "
            "They are merged as one rank",
            file=sys.stderr,
        )
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
