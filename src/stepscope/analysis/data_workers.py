"""DataLoader workers over the analysed steps: each step's batch, its worker, its timing.

Reads what the DataLoader workers' recorder wrote (``trace.worker_tracks``): ``batch N`` spans on
each worker's track, a ``DataLoader batch`` instant where the loop asked for a batch, and the
loaders' settings (``stepscope_dataloaders``).  A batch belongs to the step in which the loop
asked for it.  For each one:

- ``margin``: when the step asked minus when the worker finished the batch; ``ahead`` beyond
  ``JUST_IN_TIME_NS``, ``late`` below minus that, ``just_in_time`` between; ``in_loop`` for a
  loader without workers (the loop made it while it waited), ``unknown`` for a batch made
  before recording began (its worker and number are still known);
- the worker's dataset and collate time (wall, and the dataset's CPU), the main process's
  pinning, and ``transfer``: from the moment both the batch was done and the step asked until
  the loop had it, pinning left out;
- ``ready_ahead``: the loader's batches done and not yet taken when the step asked.

Each worker's busy share is its time making batches over its active time in the analysed
steps: from its first batch (a process's start-up makes no batch; more workers would not
shorten it) to its exit, when its loop returned in them.  The workers' stack samples taken
inside the dataset part of a batch name the slowest dataset functions (self samples at the
innermost frame).
"""

from __future__ import annotations

import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stepscope.analysis import steps as step_spans
from stepscope.analysis.data_workers_types import (
    BatchTaken,
    DataWorkersSummary,
    LoaderReport,
    WorkerFunction,
    WorkerShare,
)
from stepscope.trace.model import Trace
from stepscope.trace.names import sample_frame_label
from stepscope.trace.worker_tracks import (
    BATCH_PREFIX,
    CONSUMED_INSTANT,
    EXITED_INSTANT,
    METADATA_KEY,
    WORKER_CATEGORY,
)

__all__ = ["JUST_IN_TIME_NS", "combine_data_workers", "data_workers_summary"]

JUST_IN_TIME_NS = 1_000_000
"""A batch ready within this much of the step's asking for it is just in time."""
OPEN_FLAG = "stepscope.open_at_window_end"


@dataclass
class _Batch:
    tid: int
    start_ns: int
    end_ns: int
    finished: bool
    dataset_ns: int
    dataset_cpu_ns: int
    collate_ns: int | None
    error: bool


def _int(args: Any, key: str, default: int = 0) -> int:
    value = args.get(key, default) if args else default
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _key(args: Any) -> tuple[int, int, int, int]:
    """(iterator, worker, epoch, batch) of a batch span's or a taken batch's args."""
    return (
        _int(args, "iterator", -2),
        _int(args, "worker", -2),
        _int(args, "epoch", -2),
        _int(args, "batch", -2),
    )


def _batches(trace: Trace) -> dict[tuple[int, int, int, int], _Batch]:
    """(iterator, worker, epoch, batch) -> the worker's batch span."""
    strings, spans = trace.strings, trace.spans
    category = strings.index(WORKER_CATEGORY)
    found: dict[tuple[int, int, int, int], _Batch] = {}
    cats, names, argrefs = spans["cat"], spans["name"], spans["args"]
    tids, starts, durs = spans["tid"], spans["start_ns"], spans["dur_ns"]
    for i in range(len(spans)):
        if cats[i] != category or not strings[names[i]].startswith(BATCH_PREFIX):
            continue
        args = trace.args_at(argrefs[i]) or {}
        found[_key(args)] = _Batch(
            tids[i],
            starts[i],
            starts[i] + durs[i],
            not args.get(OPEN_FLAG),
            _int(args, "dataset_ns"),
            _int(args, "dataset_cpu_ns"),
            _int(args, "collate_ns", -1) if "collate_ns" in args else None,
            args.get("kind") == "error",
        )
    return found


def _taken(trace: Trace) -> list[tuple[int, dict[str, Any]]]:
    """(asked at, args) of each batch the loop took, by time."""
    strings = trace.strings
    if CONSUMED_INSTANT not in strings:
        return []
    name = strings.index(CONSUMED_INSTANT)
    instants = trace.instants
    rows = [
        (instants["ts_ns"][i], dict(trace.args_at(instants["args"][i]) or {}))
        for i in range(len(instants))
        if instants["name"][i] == name
    ]
    rows.sort(key=lambda row: row[0])
    return rows


def data_workers_summary(
    trace: Trace,
    source: str = "trace",
    step_range: tuple[int, int] | None = None,
    top: int = 10,
    windows: Sequence[step_spans.StepWindow] | None = None,
) -> DataWorkersSummary | None:
    """The DataLoader workers section of one trace (None when it recorded no DataLoader);
    ``windows``: its complete steps, when the caller has found them."""
    entries = trace.metadata.get(METADATA_KEY)
    if not isinstance(entries, list) or not entries or WORKER_CATEGORY not in trace.strings:
        return None
    found = step_spans.find_steps(trace)[0] if windows is None else windows
    chosen = step_spans.select_steps(found, step_range)
    if not chosen:
        return None
    spans = sorted((s.start_ns, s.end_ns, s.step) for s in chosen)
    lo, hi = spans[0][0], max(w[1] for w in spans)
    batches = _batches(trace)
    taken = _taken(trace)
    by_loader: dict[int, list[dict[str, Any]]] = {}
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("loader"), int):
            by_loader.setdefault(entry["loader"], []).append(entry)
    loaders = [
        _loader(trace, source, number, group, batches, taken, spans, (lo, hi), top)
        for number, group in sorted(by_loader.items())
    ]
    return DataWorkersSummary([x for x in loaders if x is not None], hi - lo)


def _step_of(windows: Sequence[tuple[int, int, int | None]], t: int) -> tuple[bool, int | None]:
    k = bisect_right(windows, (t, 1 << 62, 1 << 62)) - 1
    if k >= 0 and windows[k][0] <= t < windows[k][1]:
        return True, windows[k][2]
    return False, None


def _loader(
    trace: Trace,
    source: str,
    number: int,
    entries: list[dict[str, Any]],
    batches: dict[tuple[int, int, int, int], _Batch],
    taken: list[tuple[int, dict[str, Any]]],
    windows: Sequence[tuple[int, int, int | None]],
    span: tuple[int, int],
    top: int,
) -> LoaderReport | None:
    iterators = {_int(e, "iterator", -2) for e in entries}
    skip = ("loader", "workers", "iterator", "batches", "taken", "dropped")
    settings = {k: v for k, v in entries[-1].items() if k not in skip}
    pids: dict[tuple[int, int], int] = {}
    exited: set[int] = set()
    for e in entries:
        for w in e.get("workers") or []:
            if isinstance(w, dict):
                pids[(_int(e, "iterator", -2), _int(w, "worker", -2))] = _int(w, "pid")
                if w.get("exited"):
                    exited.add(_int(w, "worker", -2))
    mine = {k: b for k, b in batches.items() if k[0] in iterators}
    asked_of = {_key(a): t for t, a in taken if _int(a, "loader") == number}
    ends: dict[int, list[int]] = {}  # per iterator: when each batch was done
    taken_at: dict[int, list[int]] = {}  # ... and when the loop asked for those it took
    for key, b in mine.items():
        if key[1] >= 0 and b.finished and not b.error:
            ends.setdefault(key[0], []).append(b.end_ns)
            if key in asked_of:
                taken_at.setdefault(key[0], []).append(asked_of[key])
    for times in (*ends.values(), *taken_at.values()):
        times.sort()
    rows: list[BatchTaken] = []
    for t, args in taken:
        if _int(args, "loader") != number:
            continue
        inside, step = _step_of(windows, t)
        if not inside:
            continue
        key = _key(args)
        waiting = bisect_right(ends.get(key[0], []), t) - bisect_left(taken_at.get(key[0], []), t)
        rows.append(_row(step, t, args, mine.get(key), pids.get(key[:2]), waiting))
    workers = _shares(mine, span, pids, exited, _exits(trace))
    functions, in_dataset = _functions(trace, mine, span, top)
    counts = {s: sum(1 for r in rows if r.status == s) for s in ("ahead", "just_in_time", "late")}
    ahead_counts = [r.ready_ahead for r in rows if r.ready_ahead is not None]
    notes = []
    unknown = sum(1 for r in rows if r.status == "unknown")
    if unknown:
        depth = _int(settings, "prefetch_factor") * _int(settings, "num_workers")
        notes.append(
            f"{unknown} batches were made before recording began (workers record from the "
            "window's warm-up on): their worker and number are known, their timing is not"
            + (
                f"; a warm-up of {depth} steps (schedule(warmup={depth}), stepscope run "
                f"--warmup {depth}: prefetch_factor x num_workers) records them"
                if depth
                else ""
            )
        )
    dropped = sum(_int(e, "dropped") for e in entries)
    if dropped:
        notes.append(f"{dropped} batch records were dropped (the ring was full)")
    if not rows and not mine:
        return None
    return LoaderReport(
        source=source,
        loader=number,
        settings=settings,
        workers=workers,
        steps=rows,
        ahead=counts["ahead"],
        just_in_time=counts["just_in_time"],
        late=counts["late"],
        in_loop=sum(1 for r in rows if r.status == "in_loop"),
        unknown=unknown,
        wait_ns=sum(r.wait_ns for r in rows),
        ready_ahead_median=float(statistics.median(ahead_counts)) if ahead_counts else None,
        functions=functions,
        dataset_samples=in_dataset,
        notes=notes,
    )


def _row(
    step: int | None,
    asked: int,
    args: dict[str, Any],
    batch: _Batch | None,
    pid: int | None,
    waiting: int,
) -> BatchTaken:
    worker = _int(args, "worker", -2)
    wait, pin = _int(args, "wait_ns"), _int(args, "pin_ns")
    epoch, number = _int(args, "epoch"), _int(args, "batch")
    if batch is None or not batch.finished:
        return BatchTaken(
            step, epoch, number, worker, pid or None, "unknown", None, wait, None, None, None,
            pin, None, None,
        )  # fmt: skip
    margin = asked - batch.end_ns
    if worker < 0:
        status = "in_loop"
    elif margin > JUST_IN_TIME_NS:
        status = "ahead"
    elif margin >= -JUST_IN_TIME_NS:
        status = "just_in_time"
    else:
        status = "late"
    transfer = None if worker < 0 else max(0, asked + wait - max(batch.end_ns, asked) - pin)
    return BatchTaken(
        step=step,
        epoch=epoch,
        batch=number,
        worker=worker,
        worker_pid=pid or None,
        status=status,
        margin_ns=margin,
        wait_ns=wait,
        dataset_ns=batch.dataset_ns,
        dataset_cpu_ns=batch.dataset_cpu_ns,
        collate_ns=batch.collate_ns,
        pin_ns=pin,
        transfer_ns=transfer,
        ready_ahead=max(0, waiting) if worker >= 0 else None,
    )


def _exits(trace: Trace) -> dict[int, int]:
    """Worker track (tid) -> when its loop returned (``worker exited`` instants)."""
    strings = trace.strings
    if EXITED_INSTANT not in strings:
        return {}
    name, instants = strings.index(EXITED_INSTANT), trace.instants
    return {
        instants["tid"][i]: instants["ts_ns"][i]
        for i in range(len(instants))
        if instants["name"][i] == name
    }


def _shares(
    mine: dict[tuple[int, int, int, int], _Batch],
    span: tuple[int, int],
    pids: dict[tuple[int, int], int],
    exited: set[int],
    exits: dict[int, int],
) -> list[WorkerShare]:
    """Each worker's time making batches over its active time in ``span``: from its first
    batch (its process's start-up is not a batch) to its exit, summed over its processes."""
    lo, hi = span
    found: dict[int, list[int]] = {}  # worker -> [batches, busy, dataset, collate, active]
    lives: dict[tuple[int, int], list[int]] = {}  # (iterator, worker) -> [first, exit]
    for (iterator, worker, _, _), b in mine.items():
        if worker < 0:
            continue
        row = found.setdefault(worker, [0, 0, 0, 0, 0])
        life = lives.setdefault((iterator, worker), [b.start_ns, exits.get(b.tid, hi)])
        life[0] = min(life[0], b.start_ns)
        overlap = min(b.end_ns, hi) - max(b.start_ns, lo)
        if overlap > 0:
            row[0] += 1
            row[1] += overlap
            row[2] += b.dataset_ns
            row[3] += max(0, b.collate_ns or 0)
    for (_, worker), (first, end) in lives.items():
        found[worker][4] += max(0, min(end, hi) - max(first, lo))
    for (_, worker), _pid in pids.items():
        found.setdefault(worker, [0, 0, 0, 0, 0])
    return [
        WorkerShare(
            worker=w,
            pids=sorted({p for (_, pw), p in pids.items() if pw == w and p}),
            batches=row[0],
            busy_ns=row[1],
            busy_pct=100.0 * row[1] / row[4] if row[4] else 0.0,
            dataset_ns=row[2],
            collate_ns=row[3],
            exited=w in exited,
            active_ns=row[4],
        )
        for w, row in sorted(found.items())
    ]


def _functions(
    trace: Trace,
    mine: dict[tuple[int, int, int, int], _Batch],
    span: tuple[int, int],
    top: int,
) -> tuple[list[WorkerFunction], int]:
    """The workers' busy samples inside their batches' dataset part: functions by self count."""
    phases: dict[int, list[tuple[int, int]]] = {}
    for key, b in mine.items():
        if key[1] >= 0:
            phases.setdefault(b.tid, []).append((b.start_ns, b.start_ns + b.dataset_ns))
    if not phases or not len(trace.samples):
        return [], 0
    for runs in phases.values():
        runs.sort()
    starts = {tid: [r[0] for r in runs] for tid, runs in phases.items()}
    samples, frames, strings = trace.samples, trace.tables["frames"], trace.strings
    lo, hi = span
    labels: dict[int, list[str]] = {}
    self_count: dict[str, int] = {}
    total_count: dict[str, int] = {}
    used = 0
    for tid, ts, stack, idle in zip(
        samples["tid"].tolist(),
        samples["ts_ns"].tolist(),
        samples["stack"].tolist(),
        samples["idle"].tolist(),
        strict=True,
    ):
        runs = phases.get(tid, [])
        if not runs or idle or stack < 0 or not lo <= ts < hi:
            continue
        k = bisect_right(starts[tid], ts) - 1
        if k < 0 or ts >= runs[k][1]:
            continue
        names = labels.get(stack)
        if names is None:
            names = labels[stack] = [
                sample_frame_label(strings[frames["name"][f]], strings[frames["file"][f]])
                for f in trace.stack_frame_ids(stack)
            ]
        if not names:
            continue
        used += 1
        self_count[names[-1]] = self_count.get(names[-1], 0) + 1
        for name in set(names):
            total_count[name] = total_count.get(name, 0) + 1
    ranked = sorted(self_count.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [
        WorkerFunction(name, n, total_count[name], 100.0 * n / used) for name, n in ranked
    ], used


def combine_data_workers(
    parts: Sequence[DataWorkersSummary | None],
) -> DataWorkersSummary | None:
    """Several files' sections together: every loader of every file, each with its source."""
    kept = [p for p in parts if p is not None]
    if not kept:
        return None
    if len(kept) == 1:
        return kept[0]
    return DataWorkersSummary([x for p in kept for x in p.loaders], sum(p.span_ns for p in kept))
