"""Host breakdown: where each step's wall time went on the thread that ran it.

The step's time on its thread is split by the innermost span open at each moment (the self
times of ``trace.nesting``, which never overlap), so the categories sum to the step time.
Each span takes the category of the first rule that matches, walking from the span out to
the step:

1. ``data_loading``: ``enumerate(DataLoader)#...``, a name with ``DataLoader``, ``data
   load(ing)``, ``get_batch``/``next_batch``/``fetch_batch``.
2. ``optimizer``: ``Optimizer.step#...``, ``Optimizer.zero_grad#...``, names starting with
   ``optimizer`` / ``opt_step``.
3. ``communication``: collective launches — ``nccl:*``, ``gloo:*``, ``c10d::*``,
   ``_c10d_functional::*``, ``record_param_comms``, all_reduce / all_gather / reduce_scatter /
   all_to_all / broadcast / barrier / send / recv (not the tensor-shape operators
   ``aten::broadcast_tensors`` / ``broadcast_to`` / ``broadcast_shapes``, which move no data).
4. ``backward``: a name with ``backward`` (``## backward ##``, ``MulBackward0``) or
   ``autograd::engine::evaluate_function: ...``.
5. ``forward``: a name with ``forward`` or ``nn.Module: ...`` (module spans).

No rule matching anywhere up the chain: inside a user annotation (``record_function``, any
category ``user_annotation``) -> ``other_annotated``; a ``python_function`` span ->
``python``; a torch operator -> ``forward`` inside a *forward pass*, else ``other_operators``.

A step's forward passes are found from its backward passes, however many it holds (gradient
accumulation, two losses, a GAN's two optimizers).  A *backward pass* is the process's
backward spans (on any thread; torch's own where it has any, so a region named after a
backward hook is none) joined over the gaps in which no operator begins: the autograd engine's
own time between its nodes is backward.  Each backward pass is fed by the forward
pass that runs from the first operator outside backward, optimizer, data loading and
communication (or ``forward`` span) starting after the previous backward pass ended (or the
step began) up to that backward pass's start.  A step without backward has one forward pass,
from its first such operator to the end of its last.  Inside a forward pass, every moment
that no data-loading, optimizer, communication or backward span claims is ``forward``: the
operators, the Python between them (the modules' own code) and the program's own regions
there — so ``stepscope run``'s forward is the span a trainer's ``forward:`` annotation marks.
Operators after the step's last backward, outside the optimizer (gradient clipping,
metrics), are ``other_operators``.  A user annotation inside which a backward span begins —
a region around a whole step or micro-batch, or a trainer's ``backward`` or ``optimizer_step``
hook that runs the backward pass — says nothing, whatever its name (but data loading's and a
collective's, such as gloo's ``gloo:all_reduce`` that outlives its step): torch's own spans tell
what is backward, and what runs in the region is categorised as if it were not there; its own
time is a pass's where it lies in one (``idle_other`` elsewhere).

The step span's own time (no span open below it) is ``idle_other`` — uninstrumented Python or
waiting — except the part during which a collective runs on another thread of the same process
(the thread waits for it: gloo's and NCCL's worker threads run the collective the step waits
on), which is ``communication``, then the part during which a backward span runs on another
thread of the same process (the autograd engine's device threads), which is ``backward``, then
the part inside a forward pass, which is ``forward``; with stack samples and no
``python_function`` spans, sampled Python time moves out of uncategorised time (the step's own,
``idle_other``, and the unnamed Python of a forward pass) into ``python`` — time inside a
categorised span (data loading, optimizer, an annotation) stays in that span's category.
A step is where categories start: a ``ProfilerStep#N`` inherits nothing from a span it sits
in (with steps ended from the optimizer's post-hook, step N opens inside step N-1's
``Optimizer.step``), so its spans are categorised by what ran inside it.  An ``Optimizer.step``
inside which a backward span starts (on any thread of the process) ran a closure
(``optimizer.step(closure)``, as Lightning does): what starts inside it before that backward
ends is categorised as if the optimizer step were not there (forward, backward), its own time
up to then is ``backward`` while a backward span runs on another thread (the autograd engine's,
on a GPU) and ``idle_other`` otherwise, and only what follows is ``optimizer``.  A span that
outlives its step counts with its own time before the step's end (its children's time there
taken out); what spans do not cover is ``idle_other``.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from itertools import compress

from stepscope.analysis.device import merge_intervals
from stepscope.analysis.result import HOST_CATEGORIES, Category, HostBreakdown
from stepscope.analysis.steps import StepWindow
from stepscope.trace.model import Trace
from stepscope.trace.nesting import Nesting

__all__ = ["classify_name", "host_breakdowns", "span_categories", "total_breakdown"]

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "data_loading",
        re.compile(
            r"enumerate\(DataLoader\)|DataLoader|(?i:data[ _.-]?load)|"
            r"(?i:^(get|next|fetch)[ _]?batch)"
        ),
    ),
    ("optimizer", re.compile(r"^Optimizer\.(step|zero_grad)#|(?i:^optimizer|^opt[ _.]step)")),
    (
        "communication",
        re.compile(
            r"(?i:^(nccl|gloo|_?c10d)[:_ ]|record_param_comms|all_?reduce|all_?gather|"
            r"reduce_?scatter|all_?to_?all|broadcast(?!_(tensors|to|shapes)\b)|barrier|"
            r"^(i?send|i?recv)\b)"
        ),
    ),
    ("backward", re.compile(r"(?i:backward)|^autograd::engine::evaluate_function")),
    ("forward", re.compile(r"(?i:forward)|^nn\.Module: ")),
)
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
_ANNOTATION = "user_annotation"
_PYTHON = "python_function"
_OP_PENDING = "op"
_REGION_CATEGORIES = frozenset({_ANNOTATION, _PYTHON, "Trace", ""})
"""Span categories that mark regions of code, not operators."""


def classify_name(name: str) -> str | None:
    """The category a span name alone gives (rules 1-5 of the module docstring), or None."""
    for category, pattern in _RULES:
        if pattern.search(name):
            return category
    return None


def span_categories(trace: Trace, nesting: Nesting, host: Sequence[bool]) -> list[str]:
    """Category of every host span from its own name and those of its ancestors.

    Operators get ``op`` here; ``host_breakdowns`` decides forward or other_operators by time.
    """
    return _categorised(trace, nesting, host)[0]


def _categorised(
    trace: Trace, nesting: Nesting, host: Sequence[bool]
) -> tuple[list[str], dict[int, int]]:
    """The span categories, and the closures of ``optimizer_closures``."""
    spans = trace.spans
    names, cats = spans["name"], spans["cat"]
    strings = trace.strings
    name_ids = names.tolist()
    by_name = {n: classify_name(strings[n]) for n in sorted(set(name_ids))}
    own = list(map(by_name.__getitem__, name_ids))
    parent = nesting.parent
    cat_ids = cats.tolist()
    step_named = {n for n in by_name if strings[n].startswith("ProfilerStep#")}
    closures = optimizer_closures(trace, host, own)
    annotation = {c for c, text in enumerate(strings) if text == _ANNOTATION}
    optimizer_steps = {n for n in by_name if _OPTIMIZER_STEP.match(strings[n])}
    containers = _holding_backward(
        trace,
        host,
        own,
        lambda i: (
            cat_ids[i] in annotation
            and own[i] not in ("data_loading", "communication")  # a collective's own span
            and name_ids[i] not in step_named
            and name_ids[i] not in optimizer_steps  # a closure: optimizer_closures
        ),
        lambda i: cat_ids[i] not in annotation,  # torch's own backward spans
    )
    starts = spans["start_ns"].tolist()
    result: list[str] = [""] * len(spans)
    # what a closure's Optimizer.step hands down: its parent's category before the closure ends
    handed: dict[int, str] = {}

    def passes_down(span: int, child: int) -> str:
        end = closures.get(span)
        if end is not None and starts[child] < end:
            return handed[span]
        return result[span]

    for i in compress(range(len(spans)), host):
        if result[i]:
            continue
        chain = [i]
        p = parent[i]
        while p >= 0 and not result[p]:
            chain.append(p)
            p = parent[p]
        # inherited: the resolved category of the nearest resolved ancestor
        inherited = passes_down(p, chain[-1]) if p >= 0 else ""
        for position in range(len(chain) - 1, -1, -1):
            j = chain[position]
            named = own[j]
            cat = strings[cat_ids[j]]
            is_step = name_ids[j] in step_named
            if j in closures:
                handed[j] = inherited
            if is_step or j in containers:
                # a step's categories come from what ran inside it, nothing above; so do those
                # of a region that holds a backward pass (a whole step's or micro-batch's)
                value = ""
            elif named is not None:
                value = named
            elif inherited in ("", _OP_PENDING, "python"):
                if cat == _ANNOTATION and not is_step:
                    value = "other_annotated"
                elif cat == _PYTHON:
                    value = "python"
                elif cat in (_ANNOTATION, "Trace"):
                    value = ""
                else:
                    value = _OP_PENDING
            else:
                value = inherited
            result[j] = value
            inherited = passes_down(j, chain[position - 1]) if position else value
    return result, closures


def optimizer_closures(
    trace: Trace, host: Sequence[bool], own: Sequence[str | None]
) -> dict[int, int]:
    """``Optimizer.step`` spans that ran a backward pass inside (a closure, as Lightning's
    ``optimizer.step(closure)`` runs forward and backward), each with the end of its last
    backward span: what starts before that is the closure's work, not the optimizer's.

    A backward span counts when it starts inside the optimizer step on any thread of the same
    process (with a GPU, the autograd engine runs backward on a thread of its own)."""
    names, strings = trace.spans["name"], trace.strings
    steps = {n for n in set(names.tolist()) if _OPTIMIZER_STEP.match(strings[n])}
    if not steps:
        return {}
    return _holding_backward(trace, host, own, lambda i: names[i] in steps)


def _holding_backward(
    trace: Trace,
    host: Sequence[bool],
    own: Sequence[str | None],
    chosen: Callable[[int], bool],
    counted: Callable[[int], bool] = lambda i: True,
) -> dict[int, int]:
    """The chosen host spans inside which a backward span (one ``counted``) starts, on any
    thread of the same process, each with the end of the last such backward span."""
    spans = trace.spans
    pids = spans["pid"]
    starts, durs = spans["start_ns"], spans["dur_ns"]
    backward: dict[int, list[tuple[int, int]]] = {}
    for i in compress(range(len(spans)), host):
        if own[i] == "backward" and counted(i):
            backward.setdefault(pids[i], []).append((starts[i], starts[i] + durs[i]))
    by_pid = {pid: (sorted(ivs), sorted(lo for lo, _ in ivs)) for pid, ivs in backward.items()}
    found: dict[int, int] = {}
    if not by_pid:
        return {}
    for i in compress(range(len(spans)), host):
        if pids[i] not in by_pid or not chosen(i):
            continue
        intervals, begins = by_pid[pids[i]]
        lo, hi = bisect_left(begins, starts[i]), bisect_left(begins, starts[i] + durs[i])
        if hi > lo:
            found[i] = max(end for _, end in intervals[lo:hi])
    return found


def host_breakdowns(
    trace: Trace,
    nesting: Nesting,
    self_ns: Sequence[int],
    host: Sequence[bool],
    steps: Sequence[StepWindow],
    python_taken: dict[int, int] | None = None,
) -> list[HostBreakdown]:
    """One breakdown per step; categories sum to the step time."""
    spans = trace.spans
    pids, tids = spans["pid"], spans["tid"]
    starts, durs = spans["start_ns"].tolist(), spans["dur_ns"].tolist()
    categories, closures = _categorised(trace, nesting, host)
    children = _Children(nesting)
    python_taken = python_taken or {}
    backward_by_pid: dict[int, list[tuple[int, int]]] = {}
    tracks: dict[tuple[int, int], list[int]] = {}
    pid_list, tid_list = pids.tolist(), tids.tolist()
    host_spans = list(compress(range(len(spans)), host))
    step_tracks = {(step.pid, step.tid) for step in steps}
    if len(step_tracks) == 1:  # only the steps' tracks are read below
        ((only_pid, only_tid),) = step_tracks
        tracks[(only_pid, only_tid)] = [
            i for i in host_spans if pid_list[i] == only_pid and tid_list[i] == only_tid
        ]
    else:
        for i in host_spans:
            tracks.setdefault((pid_list[i], tid_list[i]), []).append(i)
    comm_by_pid: dict[int, list[tuple[int, int]]] = {}
    cat_ids = spans["cat"].tolist()
    regions = {c for c, text in enumerate(trace.strings) if text in _REGION_CATEGORIES}
    # backward passes come from torch's own backward spans where a process has any: a region
    # named after a backward hook (a trainer's on_after_backward) is no backward pass
    named_backward: dict[int, list[tuple[int, int]]] = {}
    for i in host_spans:
        if categories[i] in ("backward", "communication"):
            into = comm_by_pid
            if categories[i] == "backward":
                into = named_backward if cat_ids[i] in regions else backward_by_pid
            into.setdefault(pid_list[i], []).append((starts[i], starts[i] + durs[i]))
    for pid, intervals in named_backward.items():
        backward_by_pid.setdefault(pid, intervals)
    # each pid's backward (collective) time as sorted disjoint intervals: a step takes the slice
    # that overlaps it (intervals merely touching it add nothing to the overlap with its gaps)
    backward = {pid: _Intervals(merge_intervals(ivs)) for pid, ivs in backward_by_pid.items()}
    collectives = {pid: _Intervals(merge_intervals(ivs)) for pid, ivs in comm_by_pid.items()}
    by_start: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    parent = nesting.parent

    def opens(i: int) -> bool:
        """An operator outside backward, optimizer, data and communication, or a forward span."""
        category = categories[i]
        return category in (_OP_PENDING, "forward") or (
            category == "other_annotated" and cat_ids[i] not in regions
        )

    result = []
    for step in steps:
        totals = dict.fromkeys(HOST_CATEGORIES, 0)
        track = (step.pid, step.tid)
        if track not in by_start:
            order = sorted(tracks.get(track, []), key=starts.__getitem__)
            by_start[track] = (order, [starts[i] for i in order])
        order, order_starts = by_start[track]
        members = [
            i
            for i in order[
                bisect_left(order_starts, step.start_ns) : bisect_left(order_starts, step.end_ns)
            ]
            if i != step.span
        ]
        elsewhere = backward.get(step.pid)
        passes, backward_passes = _passes(members, categories, starts, durs, elsewhere, step, opens)
        pass_starts = [lo for lo, _ in passes]
        unnamed_forward = 0
        covered: list[tuple[int, int]] = []
        for i in members:
            category = categories[i]
            if category == _OP_PENDING:
                k = bisect_right(pass_starts, starts[i]) - 1
                inside = k >= 0 and starts[i] < passes[k][1]
                category = "forward" if inside else "other_operators"
            elif not category:
                category = "idle_other"
            end = min(starts[i] + durs[i], step.end_ns)
            share = self_ns[i]
            if end < starts[i] + durs[i]:  # cut at the step's end: its own time before that
                share = children.own_time(i, starts[i], end, starts, durs)
            if category == "idle_other" and (passes or backward_passes) and share > 0:
                # a region that says nothing (one holding a backward pass): its own time in a
                # forward or backward pass is that pass's
                stretches = children.own_stretches(i, starts[i], end, starts, durs)
                in_backward = min(_overlap(stretches, backward_passes), share)
                in_forward = min(_overlap(stretches, passes), share - in_backward)
                totals["backward"] += in_backward
                totals["forward"] += in_forward
                unnamed_forward += in_forward
                share -= in_backward + in_forward
            elif category == "other_annotated" and passes and share > 0:
                # a region of the program's inside a forward pass (a model's "encoder", a
                # trainer's hooks between loss and backward) is forward time all the same
                stretches = children.own_stretches(i, starts[i], end, starts, durs)
                in_forward = min(_overlap(stretches, passes), share)
                totals["forward"] += in_forward
                share -= in_forward
            if i in closures:  # the closure's own time is no optimizer work: it waits for
                # backward on the autograd engine's threads, or runs uninstrumented Python
                closure_end = min(closures[i], end)
                glue = children.own_stretches(i, starts[i], closure_end, starts, durs)
                waited = _overlap(glue, backward_passes)
                own = max(0, min(share, sum(b - a for a, b in glue)))
                waited = min(waited, own)
                in_forward = min(_overlap(glue, passes), own - waited)
                totals["backward"] += waited
                totals["forward"] += in_forward
                unnamed_forward += in_forward
                totals["idle_other"] += own - waited - in_forward
                share -= own
            # samples name the Python inside uncategorised time only: a data-loading or
            # optimizer region stays what it is, whatever Python ran inside it
            refinable = category in ("idle_other", "python")
            taken = min(python_taken.get(i, 0), share) if refinable else 0
            totals[category] += share - taken
            totals["python"] += taken
            if parent[i] == step.span or step.span < 0:
                covered.append((starts[i], end))
        own_python = python_taken.get(step.span, 0) if step.span >= 0 else 0
        totals["python"] += own_python
        gaps = _gaps(merge_intervals(covered), step.start_ns, step.end_ns)
        own_ns = sum(b - a for a, b in gaps)
        waiting = collectives.get(step.pid)
        if waiting:
            in_flight = waiting.overlapping(step.start_ns, step.end_ns)
            totals["communication"] += _overlap(gaps, in_flight)
            gaps = _subtract(gaps, in_flight)
        if backward_passes:
            totals["backward"] += _overlap(gaps, backward_passes)
            gaps = _subtract(gaps, backward_passes)
        in_passes = _overlap(gaps, passes)
        # the samples of the step's own time name its Python wherever it ran: the forward
        # pass's share of them is named Python, not unnamed forward glue
        named = own_python * in_passes // own_ns if own_ns else 0
        totals["forward"] += in_passes - min(named, in_passes)
        unnamed_forward += in_passes - min(named, in_passes)
        used = sum(totals.values())
        if used > step.dur_ns:  # spans crossing the step's edges: scale to fit
            scale = step.dur_ns / used
            for key in totals:
                totals[key] = int(totals[key] * scale)
            unnamed_forward = int(unnamed_forward * scale)
            used = sum(totals.values())
        totals["idle_other"] += step.dur_ns - used
        result.append(
            _breakdown(step.step, step.dur_ns, totals, f"{step.pid}/{step.tid}", unnamed_forward)
        )
    return result


def _passes(
    members: Sequence[int],
    categories: Sequence[str],
    starts: Sequence[int],
    durs: Sequence[int],
    backward: _Intervals | None,
    step: StepWindow,
    opens: Callable[[int], bool],
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The step's forward and backward passes (module docstring), each sorted and disjoint;
    ``members`` by start, ``opens(i)``: whether span ``i`` may open a forward pass.  A backward
    pass joins the process's backward spans up to the next forward pass's first operator (the
    autograd engine's own time between them is backward)."""
    chosen = [i for i in members if opens(i)]
    opening = [starts[i] for i in chosen]
    stretches = backward.overlapping(step.start_ns, step.end_ns) if backward else []
    joined: list[tuple[int, int]] = []
    for lo, hi in stretches:
        if joined and not _any_in(opening, joined[-1][1], lo):
            joined[-1] = (joined[-1][0], hi)
        else:
            joined.append((lo, hi))
    backward_passes = [
        (max(lo, step.start_ns), min(hi, step.end_ns))
        for lo, hi in joined
        if min(hi, step.end_ns) > max(lo, step.start_ns)
    ]
    if not opening:
        return [], backward_passes
    if not joined:
        last = max(min(starts[i] + durs[i], step.end_ns) for i in chosen)
        return ([(opening[0], last)] if last > opening[0] else []), backward_passes
    passes = []
    boundary, k = step.start_ns, 0
    for lo, hi in joined:
        while k < len(opening) and opening[k] < boundary:
            k += 1
        if k < len(opening) and opening[k] < lo:
            passes.append((opening[k], lo))
        boundary = max(boundary, hi)
    return passes, backward_passes


def _any_in(sorted_times: Sequence[int], lo: int, hi: int) -> bool:
    """Whether a time of ``sorted_times`` lies in ``[lo, hi)``."""
    k = bisect_left(sorted_times, lo)
    return k < len(sorted_times) and sorted_times[k] < hi


class _Children:
    """Each span's children, found on first use (only spans cut at a step's end ask)."""

    def __init__(self, nesting: Nesting) -> None:
        self.parent = nesting.parent
        self.of: dict[int, list[int]] | None = None

    def own_time(
        self, span: int, lo: int, hi: int, starts: Sequence[int], durs: Sequence[int]
    ) -> int:
        """Time in ``[lo, hi)`` during which ``span`` is open and none of its children is."""
        return sum(b - a for a, b in self.own_stretches(span, lo, hi, starts, durs))

    def own_stretches(
        self, span: int, lo: int, hi: int, starts: Sequence[int], durs: Sequence[int]
    ) -> list[tuple[int, int]]:
        """The stretches of ``[lo, hi)`` that none of ``span``'s children covers."""
        if self.of is None:
            self.of = {}
            for i, p in enumerate(self.parent):
                if p >= 0:
                    self.of.setdefault(p, []).append(i)
        covered = merge_intervals(
            [
                (max(starts[c], lo), min(starts[c] + durs[c], hi))
                for c in self.of.get(span, ())
                if starts[c] < hi and starts[c] + durs[c] > lo
            ]
        )
        return _gaps(covered, lo, hi) if hi > lo else []


class _Intervals:
    """Sorted disjoint intervals; ``overlapping`` slices out those overlapping a window."""

    def __init__(self, merged: list[tuple[int, int]]) -> None:
        self.merged = merged
        self.starts = [lo for lo, _ in merged]
        self.ends = [hi for _, hi in merged]

    def __bool__(self) -> bool:
        return bool(self.merged)

    def overlapping(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The intervals with ``end > lo`` and ``start < hi``."""
        return self.merged[bisect_right(self.ends, lo) : bisect_left(self.starts, hi)]


def _gaps(merged: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    gaps = []
    at = lo
    for start, end in merged:
        if start > at:
            gaps.append((at, min(start, hi)))
        at = max(at, end)
    if at < hi:
        gaps.append((at, hi))
    return gaps


def _subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of sorted disjoint intervals ``a`` that sorted disjoint ``b`` leave uncovered."""
    out = []
    j = 0
    for lo, hi in a:
        while j < len(b) and b[j][1] <= lo:
            j += 1
        k = j
        while lo < hi and k < len(b) and b[k][0] < hi:
            if b[k][0] > lo:
                out.append((lo, b[k][0]))
            lo = max(lo, b[k][1])
            k += 1
        if lo < hi:
            out.append((lo, hi))
    return out


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    total, i, j = 0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _breakdown(
    step: int | None, total: int, totals: dict[str, int], thread: str, forward_python: int = 0
) -> HostBreakdown:
    return HostBreakdown(
        step,
        total,
        [
            Category(
                name, totals.get(name, 0), 100.0 * totals.get(name, 0) / total if total else 0.0
            )
            for name in HOST_CATEGORIES
        ],
        thread,
        forward_python,
    )


def total_breakdown(steps: Sequence[HostBreakdown]) -> HostBreakdown:
    """The steps' breakdowns added up."""
    totals = dict.fromkeys(HOST_CATEGORIES, 0)
    for b in steps:
        for c in b.categories:
            totals[c.name] += c.ns
    whole = sum(b.total_ns for b in steps)
    threads = sorted({b.thread for b in steps})
    forward_python = sum(b.forward_python_ns for b in steps)
    return _breakdown(None, whole, totals, ",".join(threads), forward_python)
