"""An independent forward / backward / optimizer / data split of each step, from a trace's spans.

Reads the Chrome JSON with ``json`` alone (not stepscope's reader, nesting or rules) and, on the
thread of each ``ProfilerStep#N``, labels every moment of the step by the innermost span open
then that says what it is (spans begun before the step are the previous step's and say
nothing here; an operator inside a labelled span takes that label):

- backward: ``autograd::engine::evaluate_function...`` and any name with ``backward``;
- optimizer: ``Optimizer.step#`` / ``Optimizer.zero_grad#`` spans and ``optimizer: ...``
  annotations, less the part of one up to the end of the last backward span begun inside it (a
  closure's forward and backward; a ``zero_grad`` the closure calls stays optimizer);
- data_loading: ``enumerate(DataLoader)...``, a name with ``DataLoader`` or ``data load``
  (Lightning's ``train_dataloader_next``), ``get_batch``/``next_batch``/``fetch_batch``;
- communication: gloo / nccl / c10d spans, ``record_param_comms``, all-reduce, all-gather,
  reduce-scatter, barrier;
- forward annotations: a user annotation with ``forward`` in its name (``forward: <Model>`` of
  the HF callback, ``forward: training_step`` of the Lightning profiler,
  ``DistributedDataParallel.forward``);
- any other user annotation: its own label (neither forward nor anything above).

A user annotation inside which a backward span begins (a whole step's or micro-batch's region,
a trainer's ``backward`` or ``optimizer_step`` hook), whatever its name, says nothing; torch's
``Optimizer.step#`` keeps its closure rule.

Backward passes: the backward spans joined over the gaps in which no operator begins (the
autograd engine's own time between its nodes is backward).  Forward (issue 36's definition):
for each backward pass of the step, the forward stretch runs from the first torch operator
(``cpu_op``) outside every label, or forward annotation, that starts after the previous
boundary (the previous backward pass's end, or the step's start) to the pass's start; in a
step with no backward, from the first operator's start to the last one's end.  Every moment
of a forward stretch not labelled backward, optimizer, data loading or communication
(operators, the Python between them, other annotations) is forward, and so is a forward
annotation's time wherever it is.  Operators outside the forward
stretches and outside any label are ``other_operators``.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from pathlib import Path
from typing import Any

Interval = tuple[float, float]

CATEGORIES = (
    "forward",
    "backward",
    "optimizer",
    "data_loading",
    "communication",
    "other_operators",
)
_COMMUNICATION = re.compile(
    r"(?i:^(gloo|nccl|c10d)[:_ ]|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|"
    r"barrier)"
)
_OPTIMIZER = ("Optimizer.step#", "Optimizer.zero_grad#", "optimizer: ")
_DATA = re.compile(r"DataLoader|(?i:data[ _.-]?load)|(?i:^(get|next|fetch)[ _]?batch)")
"""Data loading as the docs define it: a DataLoader, ``data load(ing)`` (Lightning's
``train_dataloader_next``), ``get_batch`` / ``next_batch`` / ``fetch_batch``."""


def _union(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _length(intervals: list[Interval]) -> float:
    return sum(hi - lo for lo, hi in intervals)


def _label(span: dict[str, Any]) -> str | None:
    """What a span's own name says it is (None: an operator or anything else says nothing)."""
    name, cat = span["name"], span.get("cat")
    if _DATA.search(name):
        return "data_loading"
    if name.startswith(_OPTIMIZER):
        return "optimizer"
    if _COMMUNICATION.search(name):
        return "communication"
    if name.startswith("autograd::engine::evaluate_function") or "backward" in name.lower():
        return "backward"
    if cat == "user_annotation":
        return "forward" if "forward" in name.lower() else "annotation"
    return None


def _thread_spans(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("ph") == "X"]


def _holders(own: list[dict[str, Any]]) -> set[int]:
    """The user annotations (not ``Optimizer.step#``) inside which one of torch's own backward
    spans begins."""
    torch_backward = [
        x["ts"] for x in own if _label(x) == "backward" and x.get("cat") != "user_annotation"
    ]
    return {
        i
        for i, x in enumerate(own)
        if x.get("cat") == "user_annotation"
        and not x["name"].startswith("Optimizer.step#")
        and _label(x) not in ("data_loading", "communication")
        and any(x["ts"] <= t < x["ts"] + x["dur"] for t in torch_backward)
    }


def _pieces(own: list[dict[str, Any]], s: float, e: float) -> list[tuple[float, float, str]]:
    """The step [s, e) cut into pieces, each with the label of the innermost span open there
    (``op``: an operator under no label; ``idle``: no span at all).  A user annotation inside
    which a backward span begins (a whole step's or micro-batch's region) says nothing."""
    closure_end: dict[int, float] = {}
    backward_spans = [x for x in own if _label(x) == "backward"]
    holders = _holders(own)
    for i, x in enumerate(own):
        if _label(x) == "optimizer" and not x["name"].startswith("Optimizer.zero_grad#"):
            inside = [
                b["ts"] + b["dur"]
                for b in backward_spans
                if x["ts"] <= b["ts"] < x["ts"] + x["dur"]
            ]
            if inside:
                closure_end[i] = max(inside)
    order = sorted(range(len(own)), key=lambda i: (own[i]["ts"], -own[i]["dur"]))
    # stack entries: (end, own label, closure end or None, the label handed down from outside)
    stack: list[tuple[float, str, float | None, str]] = []
    pieces: list[tuple[float, float, str]] = []
    cursor = s

    def label_at(t: float) -> str:
        if not stack:
            return "idle"
        _, label, closes, outer = stack[-1]
        return outer if closes is not None and t < closes else label

    def emit(upto: float) -> None:
        nonlocal cursor
        upto = min(upto, e)
        if upto <= cursor:
            return
        closes = stack[-1][2] if stack else None
        if closes is not None and cursor < closes < upto:
            pieces.append((cursor, closes, label_at(cursor)))
            cursor = closes
        pieces.append((cursor, upto, label_at(cursor)))
        cursor = upto

    for i in order:
        x = own[i]
        while stack and stack[-1][0] <= x["ts"]:
            emit(stack[-1][0])
            stack.pop()
        emit(x["ts"])
        outer = label_at(x["ts"])
        own_label = None if i in holders else _label(x)
        if own_label is None:
            own_label = "op" if outer == "idle" and x.get("cat") == "cpu_op" else outer
        stack.append((x["ts"] + x["dur"], own_label, closure_end.get(i), outer))
    while stack:
        emit(stack[-1][0])
        stack.pop()
    emit(e)
    return pieces


def _split_one(
    own: list[dict[str, Any]], s: float, e: float, waited: list[Interval] | None = None
) -> dict[str, float]:
    """``waited``: collectives running on the process's other threads (gloo's), which the
    step's thread waits for when nothing of its own is open."""
    pieces = _pieces(own, s, e)
    holders = _holders(own)
    backward_spans = [
        x
        for i, x in enumerate(own)
        if _label(x) == "backward" and x["ts"] + x["dur"] > s and i not in holders
    ]
    # torch's own backward spans where there are any (a hook region named "backward" is no pass)
    torch_backward = [x for x in backward_spans if x.get("cat") != "user_annotation"]
    backward = _union(
        [(max(x["ts"], s), min(x["ts"] + x["dur"], e)) for x in (torch_backward or backward_spans)]
    )
    # where an operator outside backward, optimizer, data and communication (or a forward
    # annotation) begins
    piece_starts = [lo for lo, _, _ in pieces]

    def label_at(t: float) -> str:
        return pieces[max(0, bisect_right(piece_starts, t) - 1)][2]

    opening = ("op", "forward", "annotation")
    openers = [
        x
        for x in own
        if s <= x["ts"] < e
        and ((x.get("cat") == "cpu_op" and label_at(x["ts"]) in opening) or _label(x) == "forward")
    ]
    op_starts = sorted(x["ts"] for x in openers)
    # a backward pass: backward spans joined over the gaps no operator begins in (the
    # autograd engine's own time between its nodes)
    passes: list[Interval] = []
    for lo, hi in backward:
        if passes and not any(passes[-1][1] <= t < lo for t in op_starts):
            passes[-1] = (passes[-1][0], hi)
        else:
            passes.append((lo, hi))
    stretches: list[Interval] = []
    boundary = s
    for lo, hi in passes:
        first = next((t for t in op_starts if boundary <= t < lo), None)
        if first is not None:
            stretches.append((first, lo))
        boundary = hi
    if not passes and op_starts:
        last = max(x["ts"] + x["dur"] for x in openers)
        stretches.append((op_starts[0], min(last, e)))

    def within(lo: float, hi: float, intervals: list[Interval]) -> float:
        return _length([(max(lo, a), min(hi, b)) for a, b in intervals if a < hi and b > lo])

    totals = dict.fromkeys(CATEGORIES, 0.0)
    for lo, hi, label in pieces:
        if label in ("forward", "backward", "optimizer", "data_loading", "communication"):
            totals[label] += hi - lo
        elif label == "idle":
            rest = [(lo, hi)]
            for a, b in waited or []:  # waiting for another thread's collective comes first
                rest = [p for x, y in rest for p in ((x, min(y, a)), (max(x, b), y)) if p[1] > p[0]]
            totals["communication"] += hi - lo - _length(rest)
            for x, y in rest:
                totals["backward"] += within(x, y, passes)
                totals["forward"] += within(x, y, stretches)
        elif label == "annotation":  # the program's own region inside a forward pass
            totals["forward"] += within(lo, hi, stretches)
        elif label == "op":
            inside = within(lo, hi, stretches)
            totals["forward"] += inside
            totals["other_operators"] += hi - lo - inside
    return {k: 100 * v / (e - s) for k, v in totals.items()}


def step_split(path: Path) -> dict[int, dict[str, float]]:
    """Per step number: percent of the step in each of ``CATEGORIES``."""
    spans = _thread_spans(json.loads(path.read_text())["traceEvents"])
    result: dict[int, dict[str, float]] = {}
    for step in spans:
        name = step["name"]
        if not name.startswith("ProfilerStep#") or step.get("cat") != "user_annotation":
            continue
        s, e = step["ts"], step["ts"] + step["dur"]
        own = [
            x
            for x in spans
            if x["pid"] == step["pid"]
            and x["tid"] == step["tid"]
            and s <= x["ts"] < e
            and not x["name"].startswith("ProfilerStep#")
        ]
        waited = _union(
            [
                (x["ts"], x["ts"] + x["dur"])
                for x in spans
                if x["pid"] == step["pid"]
                and x["tid"] != step["tid"]
                and _label(x) == "communication"
                and x["ts"] < e
                and x["ts"] + x["dur"] > s
            ]
        )
        result[int(name.partition("#")[2])] = _split_one(own, s, e, waited)
    return result


def step_outline(path: Path, number: int, least_pct: float = 1.0) -> str:
    """The spans of step ``number`` on its thread lasting at least ``least_pct`` of it, one a line.

    For a failing comparison's message: what the step held, whichever side is wrong."""
    spans = _thread_spans(json.loads(path.read_text())["traceEvents"])
    (step,) = [x for x in spans if x["name"] == f"ProfilerStep#{number}"]
    s, e = step["ts"], step["ts"] + step["dur"]
    lines = [
        f"{x['ts'] - s:10.1f} {x['dur']:10.1f} {x.get('cat')} {x['name'][:60]}"
        for x in sorted(spans, key=lambda x: (x["ts"], -x["dur"]))
        if x["pid"] == step["pid"]
        and x["tid"] == step["tid"]
        and x["ts"] < e
        and x["ts"] + x["dur"] > s
        and x["dur"] >= step["dur"] * least_pct / 100
    ]
    return "\n".join(["     start(us)   dur(us) cat name", *lines])
