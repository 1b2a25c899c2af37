"""Stack samples as a speedscope file (https://www.speedscope.app/file-format-schema.json).

One ``sampled`` profile per thread, frames shared across profiles, one frame per function
(name, file, and the lowest line sampled in it), stacks root first.  Weights are sample counts
(unit ``none``) or, given the sampling period, time (unit ``milliseconds``).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any

from stepscope._version import __version__
from stepscope.atomic import atomic_output
from stepscope.jsonenc import json_bytes
from stepscope.trace.model import Trace

__all__ = ["SPEEDSCOPE_SCHEMA", "speedscope_document", "write_speedscope"]

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def speedscope_document(
    trace: Trace,
    *,
    name: str | None = None,
    tids: Collection[int | str] | None = None,
    include_idle: bool = True,
    sample_period_s: float | None = None,
) -> dict[str, Any]:
    """The speedscope JSON document (a dict) of the trace's samples; with ``sample_period_s``
    each sample weighs that long (unit ``milliseconds``) instead of 1 (unit ``none``)."""
    if sample_period_s is not None and not sample_period_s > 0:
        raise ValueError(f"sample_period_s must be positive, got {sample_period_s!r}")
    scale = 1.0 if sample_period_s is None else sample_period_s * 1000.0
    samples = trace.samples
    stacks, frames = trace.tables["stacks"], trace.tables["frames"]
    strings = trace.strings
    shared: list[dict[str, Any]] = []
    shared_ids: dict[tuple[int, int], int] = {}
    stack_cache: dict[int, list[int]] = {}

    def frame_index(fid: int) -> int:
        key = (frames["name"][fid], frames["file"][fid])
        index = shared_ids.get(key)
        line = frames["line"][fid]
        if index is None:
            index = shared_ids[key] = len(shared)
            entry: dict[str, Any] = {"name": strings[key[0]]}
            if key[1]:
                entry["file"] = strings[key[1]]
            if line > 0:
                entry["line"] = line
            shared.append(entry)
        elif line > 0 and line < shared[index].get("line", line + 1):
            shared[index]["line"] = line
        return index

    def stack_indices(stack: int) -> list[int]:
        found = stack_cache.get(stack)
        if found is None:
            found = []
            node = stack
            while node >= 0:
                found.append(frame_index(stacks["frame"][node]))
                node = stacks["parent"][node]
            found.reverse()
            stack_cache[stack] = found
        return found

    per_thread: dict[tuple[int | str, int | str], tuple[list[list[int]], list[float]]] = {}
    for pid, tid, stack, weight, idle in zip(
        samples["pid"],
        samples["tid"],
        samples["stack"],
        samples["weight"],
        samples["idle"],
        strict=True,
    ):
        label = trace.label(tid)
        if (tids is not None and label not in tids) or (idle and not include_idle):
            continue
        rows, weights = per_thread.setdefault((trace.label(pid), label), ([], []))
        rows.append(stack_indices(stack))
        weights.append(weight * scale if sample_period_s is not None else weight)
    names = trace.thread_names()
    profiles: list[dict[str, Any]] = []
    totals: list[float] = []
    for (pid_label, tid_label), (rows, weights) in per_thread.items():
        thread = names.get((pid_label, tid_label))
        totals.append(sum(weights))
        profiles.append(
            {
                "type": "sampled",
                "name": f"thread {tid_label}" + (f" ({thread})" if thread else ""),
                "unit": "none" if sample_period_s is None else "milliseconds",
                "startValue": 0,
                "endValue": totals[-1],
                "samples": rows,
                "weights": weights,
            }
        )
    busiest = max(range(len(totals)), key=totals.__getitem__, default=0)
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "shared": {"frames": shared},
        "profiles": profiles,
        "name": name or trace.trace_name or "stepscope samples",
        "activeProfileIndex": busiest,
        "exporter": f"stepscope {__version__}",
    }


def write_speedscope(
    trace: Trace,
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    tids: Collection[int | str] | None = None,
    include_idle: bool = True,
    sample_period_s: float | None = None,
) -> int:
    """Write the trace's samples as a speedscope file, atomically; returns the profile count."""
    document = speedscope_document(
        trace, name=name, tids=tids, include_idle=include_idle, sample_period_s=sample_period_s
    )
    with atomic_output(path, what="speedscope profile") as fh:
        fh.write(json_bytes(document))
    return len(document["profiles"])
