"""Self-time agreement between stepscope's in-process sampler and py-spy on one execution
(shared by tests/test_sampler_agreement.py and bench/bench_sampling.py)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from stepscope.collectors.sampler import Sampler, add_samples
from stepscope.sampling.pyspy import PySpySession
from stepscope.sampling.session import RunSettings
from stepscope.trace.model import Trace, TraceBuilder
from tests.pure_python_workloads import run_for

ANCHOR = "run_for"


def self_shares(trace: Trace, anchor: str = ANCHOR) -> tuple[dict[str, float], int, float]:
    """Self share of each function among the samples taken inside ``anchor``, their count, and
    their effective count.

    While the process waits for a CPU, an outside sampler reads the same stopped stack at every
    tick (py-spy at load 3 on two cores: 2093 samples, only 1286 not a repeat of the one
    before), so samples come in runs of one stack that carry one reading's information.  The
    effective count is Kish's, over those runs: (sum of run lengths)^2 / sum of squared run
    lengths; a few long waits then weigh as what they are, few readings."""
    counts: dict[str, int] = {}
    runs: list[int] = []
    previous: tuple[str, ...] = ()
    for sample in trace.iter_samples():
        if anchor in sample.stack:
            leaf = sample.stack[-1]
            counts[leaf] = counts.get(leaf, 0) + 1
            if sample.stack == previous:
                runs[-1] += 1
            else:
                runs.append(1)
            previous = sample.stack
    total = sum(counts.values())
    if not total:
        return {}, 0, 0.0
    effective = total * total / sum(n * n for n in runs)
    return {name: n / total for name, n in counts.items()}, total, effective


@dataclass(frozen=True)
class Agreement:
    """Both samplers' self shares of the top functions (py-spy's top ``n``)."""

    ours: dict[str, float]
    theirs: dict[str, float]
    our_samples: int
    their_samples: int
    our_effective: float
    their_effective: float
    mode: str
    top: list[str]

    @property
    def max_abs_diff(self) -> float:
        """Largest |our share - py-spy's share| over the top functions."""
        return max(abs(self.ours.get(name, 0.0) - self.theirs[name]) for name in self.top)

    def table(self) -> str:
        """Side by side, in percent."""
        return "\n".join(
            f"{name:<28} py-spy {100 * self.theirs[name]:5.1f}%  "
            f"stepscope {100 * self.ours.get(name, 0.0):5.1f}%"
            for name in self.top
        )


def measure(
    workload: str,
    seconds: float,
    rate_hz: float,
    *,
    py_spy_rate_hz: float = 500,
    nonblocking: bool = False,
    mode: str | None = None,
    top: int = 10,
) -> Agreement:
    """Run ``workload`` under both samplers at once (py-spy from outside, pausing the process
    for each sample unless ``nonblocking``)."""
    sampler = Sampler(rate_hz, thread_ids=[threading.get_native_id()], mode=mode, seed=7)
    sampler.start()
    if not sampler.wait_running(5):
        raise RuntimeError("the in-process sampler did not start")
    settings = RunSettings(
        rate_hz=py_spy_rate_hz,
        thread_id=threading.get_native_id(),
        all_threads=False,
        max_duration_s=seconds * 10 + 30,
        max_depth=127,
        max_samples=10_000_000,
    )
    try:
        session = PySpySession(settings, nonblocking=nonblocking)
        try:
            session.wait_running(30)
            run_for(workload, seconds)
        finally:
            trace, _, _ = session.stop(60)
    finally:
        data = sampler.stop(5)
    builder = TraceBuilder()
    add_samples(builder, data, os.getpid())
    ours, our_samples, our_effective = self_shares(builder.build())
    theirs, their_samples, their_effective = self_shares(trace)
    ranked = sorted(theirs, key=lambda name: -theirs[name])[:top]
    return Agreement(
        ours=ours,
        theirs=theirs,
        our_samples=our_samples,
        their_samples=their_samples,
        our_effective=our_effective,
        their_effective=their_effective,
        mode=sampler.mode,
        top=ranked,
    )
