"""One trace from the traces of many ranks: each rank its own group of processes, clocks aligned.

Each rank's processes get new pids (``rank * stride + k``) named ``rank N · <name>``, its flow
ids are moved into their own range, and its times are shifted by minus the clock offset to rank 0
that the first-window handshake measured (``stepscope_rank_sync``; traces without one are left
as they are).  Spans keep their tracks, so a track nests in the merged trace as it did in its
rank's file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stepscope.trace.model import Trace, TraceBuilder

__all__ = [
    "RankTrace",
    "clock_offset",
    "first_span_ns",
    "group_by_rank",
    "merge_ranks",
    "rank_in_name",
    "rank_of",
]

MAX_RANK = 2**31 - 1
"""The largest rank (torch.distributed ranks are 32-bit ints); a larger one is no rank."""
_RANK_IN_NAME = re.compile(r"_rank(\d{1,10})(?:\D|$)")
_RENAMED_META = ("process_name", "process_sort_index")


@dataclass(frozen=True)
class RankTrace:
    """One trace file of one rank: its label (file name), rank and trace."""

    label: str
    rank: int
    trace: Trace


def rank_of(trace: Trace, label: str) -> int | None:
    """The rank that wrote ``trace``: ``distributedInfo.rank``, else ``_rank{r}`` in its name."""
    info = trace.distributed_info
    value = info.get("rank") if isinstance(info, Mapping) else None
    if isinstance(value, str) and value.isdigit() and len(value) <= 10:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_RANK:
        return value
    return rank_in_name(label)


def rank_in_name(name: str) -> int | None:
    """N of ``_rank<N>`` in a file name (the trace handler's naming), or None."""
    found = _RANK_IN_NAME.search(name.rsplit("/", 1)[-1])
    return int(found.group(1)) if found else None


def group_by_rank(traces: Sequence[tuple[str, Trace]]) -> list[RankTrace]:
    """Every trace with its rank, by rank then start time; ``ValueError`` for a trace with none."""
    out: list[RankTrace] = []
    for label, trace in traces:
        rank = rank_of(trace, label)
        if rank is None:
            raise ValueError(
                f"{label}: no rank in this trace (no distributedInfo.rank and no _rank<N> in "
                "its name); write it with stepscope.trace_handler under torchrun, or add "
                '"distributedInfo": {"rank": N}'
            )
        out.append(RankTrace(label, rank, trace))
    out.sort(key=lambda r: (r.rank, r.trace.base_time_ns + first_span_ns(r.trace), r.label))
    return out


def first_span_ns(trace: Trace) -> int:
    """The start of the trace's first span (0 without spans), relative to its base time."""
    starts = trace.spans["start_ns"]
    return min(starts) if len(starts) else 0


def clock_offset(trace: Trace) -> tuple[int, int] | None:
    """(offset to rank 0, uncertainty) in ns from the trace's handshake record, if synced."""
    sync = trace.metadata.get("stepscope_rank_sync")
    if not isinstance(sync, Mapping) or sync.get("status") != "synced":
        return None
    offset, uncertainty = sync.get("clock_offset_ns"), sync.get("clock_uncertainty_ns")
    if not isinstance(offset, int) or not isinstance(uncertainty, int):
        return None
    return offset, uncertainty


def _pids(trace: Trace) -> list[int]:
    """Every pid column value the trace uses, in first-seen order."""
    seen: dict[int, None] = {}
    for table in ("spans", "instants", "counters", "flows", "meta", "samples"):
        seen.update(dict.fromkeys(trace.tables[table]["pid"]))
    return list(seen)


def _max_flow_id(ranked: Sequence[RankTrace]) -> int:
    top = 0
    for r in ranked:
        ids = r.trace.flows["flow_id"]
        if len(ids):
            top = max(top, max(ids))
    return top


def _unnamed_process(label: str) -> str:
    """A name for a process the trace did not name: its pid, or for the non-numeric tracks
    torch's profiler adds (``Spans``, ``Traces``, ``""``) what they hold."""
    if label.lstrip("-").isdigit():
        return f"pid {label}"
    return f"profiler session ({label})" if label else "profiler markers"


def merge_ranks(traces: Sequence[tuple[str, Trace]]) -> Trace:
    """Merge per-rank traces into one (see the module docstring); metadata says what was done."""
    ranked = group_by_rank(traces)
    if not ranked:
        raise ValueError("no traces to merge")
    per_rank_pids: dict[int, dict[int | str, int]] = {}
    names: dict[tuple[int, int], str] = {}
    for r in ranked:
        labels = per_rank_pids.setdefault(r.rank, {})
        process_names = r.trace.process_names()
        for value in _pids(r.trace):
            label = r.trace.label(value)
            if label not in labels:
                labels[label] = len(labels)
            names.setdefault((r.rank, labels[label]), process_names.get(label, ""))
    widest = max(len(labels) for labels in per_rank_pids.values())
    stride = 100
    while stride < widest:
        stride *= 10
    flow_stride = _max_flow_id(ranked) + 1
    builder = TraceBuilder(base_time_ns=min(r.trace.base_time_ns for r in ranked))
    merged: dict[str, Any] = {}
    for r in ranked:
        labels = per_rank_pids[r.rank]
        pid_map = {v: r.rank * stride + labels[r.trace.label(v)] for v in _pids(r.trace)}
        meta_names = r.trace.meta["name"]
        skip = {i for i, sid in enumerate(meta_names) if r.trace.strings[sid] in _RENAMED_META}
        offset = clock_offset(r.trace)
        builder.add_trace(
            r.trace,
            time_offset_ns=-offset[0] if offset else 0,
            skip_meta=skip,
            pid_map=pid_map,
            flow_id_offset=r.rank * flow_stride,
        )
        entry = merged.setdefault(str(r.rank), {"files": []})
        entry["files"].append(r.label)
        entry["clock_offset_ns"] = offset[0] if offset else None
        entry["clock_uncertainty_ns"] = offset[1] if offset else None
    for rank, labels in sorted(per_rank_pids.items()):
        for label, k in labels.items():
            pid = rank * stride + k
            original = names.get((rank, k)) or _unnamed_process(str(label))
            builder.process_name(pid, f"rank {rank} · {original}")
            builder.meta_event("process_sort_index", pid, 0, {"sort_index": pid})
    builder.metadata = {"stepscope_merged_ranks": merged}
    builder.distributed_info = {"merged_ranks": sorted(per_rank_pids)}
    builder.trace_name = "merged ranks " + ",".join(str(k) for k in sorted(per_rank_pids))
    return builder.build()
