"""An independent forward / backward / optimizer split of each step, from a trace file's spans.

Reads the Chrome JSON with ``json`` alone (not stepscope's reader or nesting) and measures, on
the thread of each ``ProfilerStep#N``, the time covered by: backward (``autograd::engine::
evaluate_function`` spans), optimizer (``Optimizer.step#`` / ``Optimizer.zero_grad#`` spans
that begin in the step — one begun in the previous step is that step's —, less the part of an
``Optimizer.step`` up to the end of the last backward span inside it: a closure's forward and
backward, though a ``zero_grad`` the closure calls stays optimizer), data loading
(``enumerate(DataLoader)``), and forward: the step's forward passes, each from the first
``cpu_op`` after the previous stretch of backward time (or the step's start) to the start of the
next stretch — operators and the Python between them — outside the three others (without
backward: from the first operator to the end of the last).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Interval = tuple[float, float]


def _union(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _minus(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for lo, hi in a:
        pieces = [(lo, hi)]
        for blo, bhi in b:
            pieces = [
                part
                for plo, phi in pieces
                for part in ((plo, min(phi, blo)), (max(plo, bhi), phi))
                if part[1] > part[0]
            ]
        out.extend(pieces)
    return out


def _length(intervals: list[Interval]) -> float:
    return sum(hi - lo for lo, hi in intervals)


def _forward_passes(
    own: list[dict[str, Any]],
    backward: list[Interval],
    s: float,
    e: float,
    elsewhere: list[Interval],
) -> list[Interval]:
    """The step's forward passes: for each backward stretch, from the first operator starting
    after the previous stretch (or the step's start), outside data loading and the optimizer,
    to the stretch's start; without backward, from the first operator to the end of the last."""
    ops = sorted(
        (x["ts"], min(x["ts"] + x["dur"], e))
        for x in own
        if x.get("cat") == "cpu_op"
        and s <= x["ts"] < e
        and not any(lo <= x["ts"] < hi for lo, hi in elsewhere)
    )
    if not ops:
        return []
    if not backward:
        return [(ops[0][0], max(end for _, end in ops))]
    passes = []
    boundary = s
    for lo, hi in backward:
        first = next((start for start, _ in ops if boundary <= start < lo), None)
        if first is not None:
            passes.append((first, lo))
        boundary = max(boundary, hi)
    return passes


def step_split(path: Path) -> dict[int, dict[str, float]]:
    """Per step number: percent of the step in forward, backward and optimizer."""
    events: list[dict[str, Any]] = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    result: dict[int, dict[str, float]] = {}
    for step in spans:
        name = step["name"]
        if not name.startswith("ProfilerStep#") or step.get("cat") != "user_annotation":
            continue
        s, e = step["ts"], step["ts"] + step["dur"]
        own = [
            x
            for x in spans
            if x["pid"] == step["pid"] and x["tid"] == step["tid"] and x is not step
        ]

        def clipped(xs: list[dict[str, Any]], lo: float = s, e: float = e) -> list[Interval]:
            return _union(
                [
                    (max(x["ts"], lo), min(x["ts"] + x["dur"], e))
                    for x in xs
                    if x["ts"] < e and x["ts"] + x["dur"] > lo
                ]
            )

        backward_spans = [
            x for x in own if x["name"].startswith("autograd::engine::evaluate_function")
        ]
        backward = clipped(backward_spans)
        closures = []
        # an Optimizer.step that began before the step is the previous step's (the step ended in
        # its post-hook): its tail here is the hooks run after the step began, not this step's
        # optimizer
        optimizer_spans = [
            x
            for x in own
            if x["name"].startswith(("Optimizer.step#", "Optimizer.zero_grad#")) and x["ts"] >= s
        ]
        for x in optimizer_spans:
            inside = [
                b["ts"] + b["dur"]
                for b in backward_spans
                if x["ts"] <= b["ts"] < x["ts"] + x["dur"]
            ]
            if inside and x["name"].startswith("Optimizer.step#"):
                closures.append((x["ts"], max(inside)))
        # a zero_grad the closure calls (Lightning's does) is still the optimizer's work
        zero_grads = clipped([x for x in optimizer_spans if "zero_grad#" in x["name"]])
        optimizer = _union(_minus(clipped(optimizer_spans), closures) + zero_grads)
        loading = clipped([x for x in own if "enumerate(DataLoader)" in x["name"]])
        forward = _minus(
            _forward_passes(own, backward, s, e, optimizer + loading),
            backward + optimizer + loading,
        )
        total = e - s
        result[int(name.partition("#")[2])] = {
            "forward": 100 * _length(forward) / total,
            "backward": 100 * _length(backward) / total,
            "optimizer": 100 * _length(optimizer) / total,
        }
    return result


def step_outline(path: Path, number: int, least_pct: float = 1.0) -> str:
    """The spans of step ``number`` on its thread lasting at least ``least_pct`` of it, one a line.

    For a failing comparison's message: what the step held, whichever side is wrong."""
    events: list[dict[str, Any]] = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
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
