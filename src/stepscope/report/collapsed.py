"""Collapsed stacks (``frame;frame;frame value`` lines) for flamegraph.pl and speedscope."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from stepscope.atomic import atomic_output
from stepscope.text import clean_text
from stepscope.trace.model import Trace
from stepscope.trace.stacks import span_stacks_ns

__all__ = [
    "CPU_METRICS",
    "DEVICE_METRICS",
    "collapsed_from_spans",
    "write_collapsed",
]

CPU_METRICS = frozenset({"self_cpu_time_total"})
DEVICE_METRICS = frozenset(
    {"self_cuda_time_total", "self_device_time_total", "self_xpu_time_total"}
)


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
        for key, weight in span_stacks_ns(trace, on_device=on_device).items():
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
