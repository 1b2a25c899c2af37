"""What one profiled call leaves behind: samples as a ``Trace``, per-function counts, outputs."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from stepscope.collectors.sampler import TRUNCATED_FRAME
from stepscope.report.collapsed import write_collapsed
from stepscope.report.flamegraph import write_flamegraph
from stepscope.report.speedscope import write_speedscope
from stepscope.trace.model import Trace, TraceBuilder
from stepscope.trace.names import sample_frame_label
from stepscope.trace.stacks import collapsed_from_samples

__all__ = ["FunctionStats", "ProfileResult", "trim_stacks"]


@dataclass(frozen=True)
class FunctionStats:
    """Samples attributed to one function (name and file)."""

    name: str
    file: str
    self_samples: int
    """Samples where the function was running (the leaf of the stack)."""
    total_samples: int
    """Samples where the function was on the stack (counted once per sample under recursion)."""
    self_share: float
    total_share: float

    @property
    def label(self) -> str:
        """``name (path/module.py)``, as in collapsed stacks."""
        return sample_frame_label(self.name, self.file)


def trim_stacks(
    trace: Trace, anchors: set[tuple[str, str]], call: tuple[int, int] | None = None
) -> tuple[Trace, int]:
    """A copy of the trace's samples whose stacks start below the last anchor frame.

    Anchors are (function name, file) pairs; stacks without one are kept whole. Samples taken
    in the anchor's own file below the anchor (the profiler starting or stopping around the
    call) are left out; their weight is returned beside the copy.  A stack cut at the sampler's
    depth has lost its anchor: with ``call`` (the call's ``[start_ns, end_ns]`` on the samples'
    clock) such a sample taken outside the call is the profiler's own too.
    """
    anchor_files = {file for _, file in anchors}
    own_weight = 0
    out = TraceBuilder(base_time_ns=trace.base_time_ns)
    out.metadata.update(trace.metadata)
    out.trace_name = trace.trace_name
    for meta in trace.iter_meta():
        out.meta_event(meta.name, meta.pid, meta.tid, dict(meta.args or {}))
    stacks, frames, strings = trace.tables["stacks"], trace.tables["frames"], trace.strings
    mapped: dict[int, int] = {-1: -1}
    cut_short: set[int] = set()  # stacks cut at the sampler's depth
    samples = trace.samples
    for pid, tid, ts, stack, weight, idle in zip(
        *(samples[c] for c in ("pid", "tid", "ts_ns", "stack", "weight", "idle")), strict=True
    ):
        sid = mapped.get(stack)
        if sid is None:
            path: list[tuple[str, str, int]] = []
            node = stack
            while node >= 0:
                fid = stacks["frame"][node]
                path.append(
                    (
                        strings[frames["name"][fid]],
                        strings[frames["file"][fid]],
                        frames["line"][fid],
                    )
                )
                node = stacks["parent"][node]
            path.reverse()
            cut = max((i + 1 for i, f in enumerate(path) if (f[0], f[1]) in anchors), default=0)
            own = cut > 0 and (cut == len(path) or path[cut][1] in anchor_files)
            sid = mapped[stack] = -2 if own else out.stack([out.frame(*f) for f in path[cut:]])
            if sid != -2 and path and path[0][0] == TRUNCATED_FRAME:
                cut_short.add(sid)
        if sid == -2 or (call is not None and sid in cut_short and not call[0] <= ts <= call[1]):
            own_weight += weight
            continue
        out.sample(trace.label(pid), trace.label(tid), ts, sid, weight, bool(idle))
    return out.build(), own_weight


def _function_stats(trace: Trace, include_idle: bool) -> tuple[list[FunctionStats], int, int]:
    stacks, frames = trace.tables["stacks"], trace.tables["frames"]
    per_stack: dict[int, tuple[tuple[int, int] | None, set[tuple[int, int]]]] = {}
    self_counts: dict[tuple[int, int], int] = {}
    total_counts: dict[tuple[int, int], int] = {}
    total = idle_total = 0
    samples = trace.samples
    for stack, weight, idle in zip(
        samples["stack"], samples["weight"], samples["idle"], strict=True
    ):
        if idle:
            idle_total += weight
            if not include_idle:
                continue
        total += weight
        entry = per_stack.get(stack)
        if entry is None:
            keys: set[tuple[int, int]] = set()
            leaf: tuple[int, int] | None = None
            node = stack
            while node >= 0:
                fid = stacks["frame"][node]
                key = (frames["name"][fid], frames["file"][fid])
                leaf = key if leaf is None else leaf
                keys.add(key)
                node = stacks["parent"][node]
            entry = per_stack[stack] = (leaf, keys)
        leaf_key, keys_on_stack = entry
        if leaf_key is not None:
            self_counts[leaf_key] = self_counts.get(leaf_key, 0) + weight
        for key in keys_on_stack:
            total_counts[key] = total_counts.get(key, 0) + weight
    s = trace.strings
    stats = [
        FunctionStats(
            s[key[0]],
            s[key[1]],
            self_counts.get(key, 0),
            count,
            self_counts.get(key, 0) / total if total else 0.0,
            count / total if total else 0.0,
        )
        for key, count in total_counts.items()
    ]
    stats.sort(key=lambda f: (-f.self_samples, -f.total_samples, f.name))
    return stats, total, idle_total


@dataclass(frozen=True)
class ProfileResult:
    """The results of one ``FunctionProfiler.profile`` run."""

    trace: Trace
    """The samples (stacks start at the profiled function)."""
    backend: str
    """``inprocess`` or ``py-spy``."""
    rate_hz: float
    duration_s: float
    """Wall time of the profiled call."""
    run_id: int
    tags: tuple[str, ...] = ()
    include_idle: bool = True
    truncated: bool = False
    """Sampling stopped at ``max_profile_duration_sec`` before the call returned."""
    function_raised: bool = False
    dropped_samples: int = 0
    profiler_samples: int = 0
    """Samples taken in the profiler's own code around the call (not in the totals)."""
    fallback_reason: str | None = None
    """Why the requested backend was not used, when the profiler fell back to another."""
    function_name: str = ""
    """Qualified name of the profiled function (titles of the outputs)."""
    functions: tuple[FunctionStats, ...] = field(init=False)
    """Every sampled function, by self samples (most first)."""
    total_samples: int = field(init=False)
    idle_samples: int = field(init=False)
    collapsed: dict[str, int] = field(init=False)
    """Collapsed stacks (``a;b;c`` -> samples)."""

    def __post_init__(self) -> None:
        stats, total, idle = _function_stats(self.trace, self.include_idle)
        object.__setattr__(self, "functions", tuple(stats))
        object.__setattr__(self, "total_samples", total)
        object.__setattr__(self, "idle_samples", idle)
        collapsed = collapsed_from_samples(self.trace, include_idle=self.include_idle)
        object.__setattr__(self, "collapsed", collapsed)

    def top_self(self, n: int = 10) -> list[FunctionStats]:
        """The ``n`` functions with the most self samples."""
        return list(self.functions[:n])

    def top_total(self, n: int = 10) -> list[FunctionStats]:
        """The ``n`` functions with the most total (inclusive) samples."""
        ranked = sorted(self.functions, key=lambda f: (-f.total_samples, -f.self_samples, f.name))
        return ranked[:n]

    def function(self, name: str) -> FunctionStats:
        """Stats of a function by name (``fib``, ``Model.forward``) or label; KeyError if absent."""
        for f in self.functions:
            if name in (f.name, f.label) or f.name.rsplit(".", 1)[-1] == name:
                return f
        known = ", ".join(f.name for f in self.functions[:10])
        raise KeyError(f"no samples of function {name!r}; the top functions are: {known}")

    def summary(self) -> dict[str, Any]:
        """Headline numbers as plain data."""
        return {
            "run_id": self.run_id,
            "backend": self.backend,
            "rate_hz": self.rate_hz,
            "duration_s": round(self.duration_s, 6),
            "total_samples": self.total_samples,
            "idle_samples": self.idle_samples,
            "dropped_samples": self.dropped_samples,
            "profiler_samples": self.profiler_samples,
            "truncated": self.truncated,
            "tags": list(self.tags),
        }

    def table(self, n: int = 15) -> str:
        """A top-``n`` table of functions by self samples, with total samples beside."""
        from stepscope.report.sampling_table import sampling_table

        return sampling_table(self, n)

    def print_table(self, n: int = 15, file: IO[str] | None = None) -> None:
        """Print :meth:`table`."""
        print(self.table(n), file=file or sys.stdout)

    def write_collapsed(self, path: str | os.PathLike[str]) -> int:
        """Collapsed stacks file (flamegraph.pl input); returns the number of stacks."""
        return write_collapsed(self.collapsed, path)

    @property
    def title(self) -> str:
        """``<function> (stepscope run N)``, the name the outputs carry."""
        run = f"stepscope run {self.run_id}"
        return f"{self.function_name} ({run})" if self.function_name else run

    def write_speedscope(self, path: str | os.PathLike[str]) -> int:
        """speedscope JSON (weights in milliseconds of sampling); returns the thread profiles."""
        return write_speedscope(
            self.trace,
            path,
            name=self.title,
            include_idle=self.include_idle,
            sample_period_s=1.0 / self.rate_hz,
        )

    def write_flamegraph(self, path: str | os.PathLike[str]) -> int:
        """Flame graph SVG; returns the number of frames drawn."""
        title = f"{self.title}: {self.total_samples} samples ({self.backend})"
        return write_flamegraph(self.collapsed, path, title=title)

    def write_all(self, directory: str | os.PathLike[str], stem: str) -> dict[str, Path]:
        """Write the collapsed stacks, speedscope JSON and flame graph into ``directory``."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        paths = {
            "collapsed": folder / f"{stem}.collapsed.txt",
            "speedscope": folder / f"{stem}.speedscope.json",
            "flamegraph": folder / f"{stem}.svg",
        }
        self.write_collapsed(paths["collapsed"])
        self.write_speedscope(paths["speedscope"])
        self.write_flamegraph(paths["flamegraph"])
        return paths
