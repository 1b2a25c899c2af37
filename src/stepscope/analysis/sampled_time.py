"""Python time from stack samples, fitted into the span table without double counting.

Each busy (non-idle) sample of a thread stands for the thread's mean sampling interval (the
nominal ``1 / rate`` when the thread has fewer than three samples).  It
belongs to the innermost span open on its thread at that moment (``trace.nesting``):

- inside a torch operator (or any span other than a step marker, annotation or Python frame) the
  time is the operator's, and the sample is left out: its Python stack only names the caller;
- otherwise the sample's time moves from that span's self time to the sampled functions: self
  time to the innermost frame, total time to every function on the stack (once per sample).
  A span never gives more than its own self time: the samples inside it are scaled down to fit.

So with samples the table still adds up to the busy time of the window.  Frames of stepscope
itself and of ``runpy`` (the launcher of ``python -m`` and ``stepscope run``) are left out of
the stacks.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from stepscope.trace.model import Trace
from stepscope.trace.names import is_hidden, sample_frame_label
from stepscope.trace.nesting import innermost_spans_at
from stepscope.trace.worker_tracks import worker_tracks

__all__ = ["SampledFunction", "SampledTime", "sampled_time"]

PYTHON_HOLDERS = frozenset({"user_annotation", "python_function", "Trace", ""})
"""Span categories whose time samples may claim (anything else, e.g. ``cpu_op``, keeps it)."""


@dataclass
class SampledFunction:
    """Time of one sampled Python function (ns, estimated from samples)."""

    samples: int = 0
    self_ns: float = 0.0
    total_ns: float = 0.0


@dataclass
class SampledTime:
    """What the samples of one trace add to its table."""

    functions: dict[str, SampledFunction] = field(default_factory=dict)
    taken_from_spans: dict[int, int] = field(default_factory=dict)
    """Span index -> self time (ns) moved to the sampled functions."""
    samples_used: int = 0
    samples_in_ops: int = 0


def sampled_time(trace: Trace, self_ns: array[int]) -> SampledTime:
    """Sampled functions of ``trace`` and the span self time they take over."""
    result = SampledTime()
    samples = trace.samples
    if not len(samples):
        return result
    frames, strings = trace.tables["frames"], trace.strings
    labels: dict[int, list[str]] = {}

    def functions_of(stack: int) -> list[str]:
        """Labels of a stack's frames, root first, without hidden frames."""
        found = labels.get(stack)
        if found is None:
            files = [(fid, strings[frames["file"][fid]]) for fid in trace.stack_frame_ids(stack)]
            found = labels[stack] = [
                sample_frame_label(strings[frames["name"][fid]], file)
                for fid, file in files
                if not is_hidden(file)
            ]
        return found

    pids, tids, times = samples["pid"], samples["tid"], samples["ts_ns"]
    idle, stack_col = samples["idle"], samples["stack"]
    by_thread: dict[tuple[int, int], list[int]] = {}
    for i in range(len(samples)):
        by_thread.setdefault((pids[i], tids[i]), []).append(i)
    sampler = trace.metadata.get("stepscope_sampler")
    rate = sampler.get("rate_hz") if isinstance(sampler, dict) else None
    nominal = 1e9 / rate if isinstance(rate, (int, float)) and rate > 0 else 0.0
    interval: dict[tuple[int, int], float] = {}
    for key, rows in by_thread.items():
        first, last = min(times[r] for r in rows), max(times[r] for r in rows)
        interval[key] = (last - first) / (len(rows) - 1) if len(rows) > 2 else nominal
    workers = worker_tracks(trace)  # DataLoader worker processes: their own section
    busy = [
        i
        for i in range(len(samples))
        if not idle[i] and functions_of(stack_col[i]) and (pids[i], tids[i]) not in workers
    ]
    holder = innermost_spans_at(trace, [(pids[i], tids[i], times[i]) for i in busy])
    cats, strings_of = trace.spans["cat"], trace.strings
    claims: dict[int, list[int]] = {}
    for i in busy:
        span = holder[(pids[i], tids[i], times[i])]
        if span >= 0 and strings_of[cats[span]] not in PYTHON_HOLDERS:
            result.samples_in_ops += 1
            continue
        claims.setdefault(span, []).append(i)
    for span, rows in claims.items():
        wanted = sum(interval[(pids[i], tids[i])] for i in rows)
        scale = 1.0
        if span >= 0 and wanted > self_ns[span]:
            scale = self_ns[span] / wanted if wanted else 0.0
        if span >= 0:
            result.taken_from_spans[span] = round(wanted * scale)
        for i in rows:
            weight = interval[(pids[i], tids[i])] * scale
            stack = functions_of(stack_col[i])
            leaf = result.functions.setdefault(stack[-1], SampledFunction())
            leaf.self_ns += weight
            for name in set(stack):
                function = result.functions.setdefault(name, SampledFunction())
                function.samples += 1
                function.total_ns += weight
            result.samples_used += 1
    return result
