"""Counter tracks: samples ``CounterSet`` values during a recording window into the trace.

Each sample reads every counter of every chosen set once (at ``start``, at each ``on_step`` and at
``stop``).  ``collect`` writes one counter event per set and sample, named ``counters.<set>`` with
one series per counter, so Perfetto and chrome://tracing draw a track per counter.  What each set
gained over the window goes into the trace metadata as ``stepscope_counters``.
"""

from __future__ import annotations

from collections.abc import Iterable

from stepscope.clock import now_ns
from stepscope.collectors.base import Collector, WindowContext
from stepscope.counters import CounterSet, Number, counter_sets
from stepscope.trace.model import TraceBuilder

__all__ = ["CounterCollector"]

TRACK_PREFIX = "counters."

_Sample = tuple[int, dict[str, dict[str, Number]]]


class CounterCollector(Collector):
    """Samples counter sets at window start, each step boundary and window stop."""

    name = "counters"
    collects_off_loop = True

    def __init__(
        self, sets: Iterable[CounterSet] | None = None, max_samples: int = 100_000
    ) -> None:
        if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 2:
            raise ValueError(
                f"max_samples must be an int >= 2 (start and stop), got {max_samples!r}"
            )
        chosen = None if sets is None else list(sets)
        if chosen is not None:
            bad = [s for s in chosen if not isinstance(s, CounterSet)]
            if bad:
                raise TypeError(f"sets must be CounterSet objects, got {bad[0]!r}")
        self._fixed = chosen
        self.max_samples = max_samples
        self._sets: list[CounterSet] = []
        self._samples: list[_Sample] = []
        self._dropped = 0
        self._recording = False

    def _sample(self) -> None:
        ts = now_ns()
        values = {s.name: s.snapshot() for s in self._sets}
        self._samples.append((ts, values))

    def start(self, ctx: WindowContext) -> None:
        """Take the first sample (the sets are chosen now: all shared sets unless given)."""
        self._sets = list(self._fixed) if self._fixed is not None else counter_sets()
        self._samples = []
        self._dropped = 0
        self._recording = True
        self._sample()

    def on_step(self, ctx: WindowContext, step: int) -> None:
        """Sample at a step boundary (the profiler calls this on ``step()`` while recording)."""
        if not self._recording:
            return
        if len(self._samples) >= self.max_samples - 1:  # keep room for the stop sample
            self._dropped += 1
            return
        self._sample()

    def stop(self, ctx: WindowContext) -> None:
        """Take the last sample and record what each set gained over the window."""
        if not self._recording:
            return
        self._recording = False
        self._sample()
        first, last = self._samples[0][1], self._samples[-1][1]
        gained: dict[str, dict[str, Number]] = {}
        for set_name, values in last.items():
            before = first.get(set_name, {})
            changes = {k: v - before.get(k, 0) for k, v in values.items() if v != before.get(k, 0)}
            if changes:
                gained[set_name] = changes
        ctx.held[id(self)], self._samples = self._samples, []
        if gained:
            ctx.metadata["stepscope_counters"] = gained
        if self._dropped:
            ctx.metadata["stepscope_counter_samples_dropped"] = self._dropped
            ctx.summary.append(
                f"{self._dropped} counter samples dropped (max_samples={self.max_samples})"
            )

    def collect(self, builder: TraceBuilder, ctx: WindowContext) -> None:
        """Append one counter event per set and sample."""
        pid = ctx.pid
        for ts, per_set in ctx.held.pop(id(self), []):
            for set_name, values in per_set.items():
                if values:
                    builder.counter(TRACK_PREFIX + set_name, pid, ts, values)

    def close(self) -> None:
        """Forget any samples not collected."""
        self._recording = False
        self._samples = []
