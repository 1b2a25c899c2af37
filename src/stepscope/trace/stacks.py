"""Folded stacks of a trace (``root;...;leaf`` -> weight): nested spans by self time, stack
samples by count.  The collapsed-stack files, the flame graphs and the function profiler's
results are all drawn from these."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Collection, Sequence

from stepscope.trace.model import Trace
from stepscope.trace.names import frame_label, sample_frame_label
from stepscope.trace.nesting import DEVICE_CATEGORIES, Nesting, group_name, nest_spans
from stepscope.trace.worker_tracks import WORKER_CATEGORY

__all__ = ["collapsed_from_samples", "span_stacks_ns"]


def collapsed_from_samples(
    trace: Trace,
    *,
    tids: Collection[int | str] | None = None,
    include_idle: bool = True,
    per_thread: bool = False,
    windows: Sequence[tuple[int, int]] | None = None,
) -> dict[str, int]:
    """Stacks of the trace's samples (root first, one frame per function) weighted by count.

    ``tids`` keeps only those threads; ``include_idle=False`` drops samples of idle threads;
    ``per_thread`` puts a ``thread <tid>`` frame at the root of each stack; ``windows``
    (``[start_ns, end_ns)`` pairs) keeps only the samples taken inside them.
    """
    samples = trace.samples
    stacks, frames = trace.tables["stacks"], trace.tables["frames"]
    strings = trace.strings
    frame_labels: dict[int, str] = {}
    stack_keys: dict[int, str] = {}
    totals: dict[str, int] = {}
    for tid, stack, weight, idle, ts in zip(
        samples["tid"],
        samples["stack"],
        samples["weight"],
        samples["idle"],
        samples["ts_ns"],
        strict=True,
    ):
        label = trace.label(tid)
        if (tids is not None and label not in tids) or (idle and not include_idle):
            continue
        if windows is not None and not any(lo <= ts < hi for lo, hi in windows):
            continue
        key = stack_keys.get(stack)
        if key is None:
            parts: list[str] = []
            node = stack
            while node >= 0:
                fid = stacks["frame"][node]
                text = frame_labels.get(fid)
                if text is None:
                    text = sample_frame_label(
                        strings[frames["name"][fid]], strings[frames["file"][fid]]
                    )
                    frame_labels[fid] = text
                parts.append(text)
                node = stacks["parent"][node]
            key = stack_keys[stack] = ";".join(reversed(parts)) or "[no Python frames]"
        if per_thread:
            key = f"thread {label};{key}"
        totals[key] = totals.get(key, 0) + weight
    return totals


def span_stacks_ns(
    trace: Trace,
    *,
    on_device: bool = False,
    keep: Callable[[int], bool] | None = None,
    nesting: Nesting | None = None,
) -> dict[str, int]:
    """Stacks of one trace's nested spans (root first) weighted by self time in nanoseconds.

    Host spans, or device spans with ``on_device``; ``keep(i)`` (a span index) limits which
    spans' self times count (their enclosing spans still name the stack).
    """
    nesting = nest_spans(trace) if nesting is None else nesting
    spans = trace.spans
    names, cats = spans["name"].tolist(), spans["cat"].tolist()
    strings = trace.strings
    parent, folded, self_ns = nesting.parent, nesting.folded, nesting.self_ns
    # Every span's stack (the unfolded spans from the root down to it) is a node of a trie of
    # stacks: node 0 is the empty stack, a node's children are keyed by name id.  Each distinct
    # stack's text is built once, from its parent's.
    node_of = array("i", [-1]) * len(spans)  # -1: not known yet
    child_of: dict[tuple[int, int], int] = {}
    texts, empty = [""], [True]
    frame_of: dict[int, str] = {}

    def node(i: int) -> int:
        path = []
        j = i
        while j >= 0 and node_of[j] < 0:
            path.append(j)
            j = parent[j]
        at = node_of[j] if j >= 0 else 0
        for j in reversed(path):
            if not folded[j]:
                name_id = names[j]
                found = child_of.get((at, name_id))
                if found is None:
                    frame = frame_of.get(name_id)
                    if frame is None:
                        frame = frame_of[name_id] = frame_label(group_name(strings[name_id]))
                    found = child_of[(at, name_id)] = len(texts)
                    texts.append(frame if empty[at] else f"{texts[at]};{frame}")
                    empty.append(False)
                at = found
            node_of[j] = at
        return at

    totals_ns: dict[str, int] = {}
    for i in range(len(spans)):
        cat = strings[cats[i]]
        if cat in ("Trace", WORKER_CATEGORY) or (cat in DEVICE_CATEGORIES) != on_device:
            continue
        weight = self_ns[i]
        if weight <= 0 or (keep is not None and not keep(i)):
            continue
        key = texts[node(i)]
        totals_ns[key] = totals_ns.get(key, 0) + weight
    return totals_ns
