"""Collapsed stacks (``frame;frame;frame value`` lines) for flamegraph.pl and speedscope."""

from __future__ import annotations

import os
import sys
from collections.abc import Collection, Iterable, Mapping

from stepscope.atomic import atomic_output
from stepscope.text import clean_text
from stepscope.trace.model import Trace
from stepscope.trace.nesting import DEVICE_CATEGORIES, group_name, nest_spans

__all__ = [
    "CPU_METRICS",
    "DEVICE_METRICS",
    "collapsed_from_samples",
    "collapsed_from_spans",
    "frame_label",
    "sample_frame_label",
    "short_path",
    "write_collapsed",
]

CPU_METRICS = frozenset({"self_cpu_time_total"})
DEVICE_METRICS = frozenset(
    {"self_cuda_time_total", "self_device_time_total", "self_xpu_time_total"}
)


def frame_label(name: str) -> str:
    """A frame name safe for the collapsed format (no ';', no line breaks)."""
    return " ".join(name.replace(";", ":").split()) or "?"


def short_path(file: str) -> str:
    """A source path without the longest ``sys.path`` entry it starts with (as py-spy shows it)."""
    best = ""
    for entry in sys.path:
        root = entry.rstrip(os.sep) + os.sep if entry else ""
        if root and file.startswith(root) and len(root) > len(best):
            best = root
    return file[len(best) :] if best else file


def sample_frame_label(name: str, file: str) -> str:
    """The collapsed-stack label of a sampled frame: ``function (path/module.py)``."""
    return frame_label(f"{name} ({short_path(file)})" if file else name)


def collapsed_from_samples(
    trace: Trace,
    *,
    tids: Collection[int | str] | None = None,
    include_idle: bool = True,
    per_thread: bool = False,
) -> dict[str, int]:
    """Stacks of the trace's samples (root first, one frame per function) weighted by count.

    ``tids`` keeps only those threads; ``include_idle=False`` drops samples of idle threads;
    ``per_thread`` puts a ``thread <tid>`` frame at the root of each stack.
    """
    samples = trace.samples
    stacks, frames = trace.tables["stacks"], trace.tables["frames"]
    strings = trace.strings
    frame_labels: dict[int, str] = {}
    stack_keys: dict[int, str] = {}
    totals: dict[str, int] = {}
    for tid, stack, weight, idle in zip(
        samples["tid"], samples["stack"], samples["weight"], samples["idle"], strict=True
    ):
        label = trace.label(tid)
        if (tids is not None and label not in tids) or (idle and not include_idle):
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


def collapsed_from_spans(
    traces: Iterable[Trace], metric: str = "self_cpu_time_total"
) -> dict[str, int]:
    """Stacks of nested spans (root first) weighted by self time in microseconds."""
    if metric in CPU_METRICS:
        on_device = False
    elif metric in DEVICE_METRICS:
        on_device = True
    else:
        valid = ", ".join(sorted(CPU_METRICS | DEVICE_METRICS))
        raise ValueError(f"unknown export_stacks metric {metric!r}; valid metrics: {valid}")
    totals_ns: dict[str, int] = {}
    for trace in traces:
        nesting = nest_spans(trace)
        spans = trace.spans
        names, cats = spans["name"], spans["cat"]
        strings = trace.strings
        for i in range(len(spans)):
            cat = strings[cats[i]]
            if cat == "Trace" or (cat in DEVICE_CATEGORIES) != on_device:
                continue
            weight = nesting.self_ns[i]
            if weight <= 0:
                continue
            chain = [j for j in (i, *nesting.ancestors(i)) if not nesting.folded[j]]
            key = ";".join(frame_label(group_name(strings[names[j]])) for j in reversed(chain))
            totals_ns[key] = totals_ns.get(key, 0) + weight
    return {k: round(v / 1000) for k, v in totals_ns.items() if round(v / 1000) > 0}


def _one_line(stack: str) -> str:
    """A stack as one line of valid UTF-8 (line breaks in frame names become spaces)."""
    return clean_text(stack).replace("\r", " ").replace("\n", " ")


def write_collapsed(stacks: Mapping[str, int], path: str | os.PathLike[str]) -> int:
    """Write collapsed stacks atomically, heaviest first; returns the number of lines."""
    lines = [
        f"{_one_line(stack)} {value}\n"
        for stack, value in sorted(stacks.items(), key=lambda kv: -kv[1])
    ]
    with atomic_output(path, what="stacks") as fh:
        fh.write("".join(lines).encode("utf-8"))
    return len(lines)
