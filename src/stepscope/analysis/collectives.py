"""Collectives in one rank's trace, identified by their metadata, and the steps they belong to.

A collective is identified by ``CollectiveKey``: the collective's name, its process group and
its size, read from torch's metadata when the trace has it (``Collective name``, ``Process
Group Name`` / ``Process Group Description``, ``In msg nelems``, ``dtype`` — on NCCL kernels and
``record_param_comms``), else from the backend's own span (``gloo:all_reduce`` on gloo's worker
thread: the collective from the name, the size and type from ``Input Dims`` / ``Input type``).
The spans that show a collective in flight are the device kernels carrying that metadata when
the trace has any, else the host spans named ``<backend>:<collective>``.  Instances are matched
across ranks by (step, key, k): the k-th call of the same collective on the same group with the
same size in the same step, since every rank of a group issues its collectives in one order.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from stepscope.analysis.device import merge_intervals
from stepscope.analysis.host import classify_name
from stepscope.analysis.steps import StepWindow
from stepscope.trace.model import Trace
from stepscope.trace.nesting import DEVICE_CATEGORIES

__all__ = ["CollectiveCall", "CollectiveKey", "collective_calls", "host_partitions"]

_BACKEND_SPAN = re.compile(r"^(gloo|nccl|mpi|ucc|xccl|hccl):([A-Za-z_]+)$")
_NOT_WORK = frozenset({"Trace", "cuda_profiler_range"}) | DEVICE_CATEGORIES


class CollectiveKey(NamedTuple):
    """What identifies a collective across ranks."""

    name: str
    group: str
    nelems: int
    dtype: str


class CollectiveCall(NamedTuple):
    """One collective in flight on one rank: the step it ran in, its key, index and times."""

    step: int
    key: CollectiveKey
    nth: int
    """k: this is the k-th call with this key in this step on this rank."""
    start_ns: int
    dur_ns: int


def _nelems(args: Mapping[str, Any]) -> int:
    value = args.get("In msg nelems")
    if isinstance(value, int):
        return value
    dims = args.get("Input Dims")
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        return math.prod(int(d) for d in dims[0] if isinstance(d, int))
    return -1


def _dtype(args: Mapping[str, Any]) -> str:
    value = args.get("dtype")
    if isinstance(value, str):
        return value.lower()
    types = args.get("Input type")
    if isinstance(types, list) and types and isinstance(types[0], str):
        return types[0].lower()
    return ""


def _key(name: str, args: Mapping[str, Any]) -> CollectiveKey:
    group = args.get("Process Group Name", args.get("Process Group Description", ""))
    collective = args.get("Collective name")
    if not isinstance(collective, str):
        m = _BACKEND_SPAN.match(name)
        collective = m.group(2).replace("_", "") if m else name
    return CollectiveKey(collective.replace("_", ""), str(group), _nelems(args), _dtype(args))


def collective_calls(trace: Trace, steps: Sequence[StepWindow]) -> list[CollectiveCall]:
    """The collectives in flight inside ``steps`` (see the module docstring), by start time."""
    spans = trace.spans
    names, cats, refs = spans["name"], spans["cat"], spans["args"]
    starts, durs = spans["start_ns"], spans["dur_ns"]
    strings = trace.strings
    device_cats = {i for i, s in enumerate(strings) if s in DEVICE_CATEGORIES}
    backend_names = {i for i, s in enumerate(strings) if _BACKEND_SPAN.match(s)}
    on_device: list[int] = []
    on_host: list[int] = []
    for i in range(len(spans)):
        if cats[i] in device_cats:
            args = trace.args_at(refs[i])
            if args is not None and "Collective name" in args:
                on_device.append(i)
        elif names[i] in backend_names:
            on_host.append(i)
    chosen = on_device or on_host
    ordered = [s for s in steps if s.step is not None]
    ordered.sort(key=lambda s: s.start_ns)
    step_starts = [s.start_ns for s in ordered]
    counts: dict[tuple[int, CollectiveKey], int] = {}
    calls: list[CollectiveCall] = []
    for i in sorted(chosen, key=lambda j: starts[j]):
        k = bisect_right(step_starts, starts[i]) - 1
        if k < 0 or starts[i] >= ordered[k].end_ns:
            continue
        step = ordered[k].step
        assert step is not None
        key = _key(strings[names[i]], trace.args_at(refs[i]) or {})
        index = counts.get((step, key), 0)
        counts[(step, key)] = index + 1
        calls.append(CollectiveCall(step, key, index, starts[i], durs[i]))
    return calls


def _clipped(merged: list[tuple[int, int]], starts: list[int], lo: int, hi: int) -> int:
    """Length of disjoint sorted ``merged`` intervals inside ``[lo, hi)``."""
    total = 0
    k = max(0, bisect_right(starts, lo) - 1)
    while k < len(merged) and merged[k][0] < hi:
        total += max(0, min(merged[k][1], hi) - max(merged[k][0], lo))
        k += 1
    return total


def host_partitions(
    trace: Trace, steps: Sequence[StepWindow]
) -> dict[int | None, tuple[int, int, int]]:
    """Step -> (computation, communication, idle) ns on the host; the three sum to its time.

    Communication: a collective span (host.py's ``communication`` names, or any span with
    ``Collective name``) is open on any host thread of the step's process; computation: no
    collective but some other span is open (the step spans themselves excluded); idle: neither.
    """
    spans = trace.spans
    names, cats, pids, refs = spans["name"], spans["cat"], spans["pid"], spans["args"]
    starts, durs = spans["start_ns"], spans["dur_ns"]
    strings = trace.strings
    wanted = {s.pid for s in steps}
    skip_cats = {i for i, c in enumerate(strings) if c in _NOT_WORK}
    comm_names = {i for i, n in enumerate(strings) if classify_name(n) == "communication"}
    step_names = {i for i, n in enumerate(strings) if n.startswith("ProfilerStep#")}
    comm: dict[int, list[tuple[int, int]]] = {p: [] for p in wanted}
    work: dict[int, list[tuple[int, int]]] = {p: [] for p in wanted}
    for i in range(len(spans)):
        pid = pids[i]
        if pid not in wanted or cats[i] in skip_cats or names[i] in step_names:
            continue
        interval = (starts[i], starts[i] + durs[i])
        if names[i] in comm_names:
            comm[pid].append(interval)
            continue
        args = trace.args_at(refs[i]) if refs[i] >= 0 else None
        (comm if args is not None and "Collective name" in args else work)[pid].append(interval)
    unions: dict[int, tuple[list[tuple[int, int]], list[int], list[tuple[int, int]], list[int]]]
    unions = {}
    for pid in wanted:
        c = merge_intervals(comm[pid])
        b = merge_intervals(comm[pid] + work[pid])
        unions[pid] = (c, [x[0] for x in c], b, [x[0] for x in b])
    out: dict[int | None, tuple[int, int, int]] = {}
    for step in steps:
        c, c_starts, b, b_starts = unions[step.pid]
        communication = _clipped(c, c_starts, step.start_ns, step.end_ns)
        busy = _clipped(b, b_starts, step.start_ns, step.end_ns)
        out[step.step] = (busy - communication, communication, step.dur_ns - busy)
    return out
