"""The in-process sampler attributes self time as py-spy does (issue 12, point 4).

Both sample the same execution at once (py-spy from outside, pausing the process 500 times a
second; the in-process sampler at 1 kHz), so what is left between them is sampling noise: about
1.2 percentage points of standard error per function at ~2000 samples each, against the 3-point
tolerance.  A loaded machine gives both fewer independent samples, py-spy most: while the
process waits for a CPU it reads the same stopped stack at every tick and counts each read,
where the in-process sampler takes one sample per wait.  Measured on raytrace at load 6 on two
cores, py-spy's 2000 samples came in runs of one stack that left it 22-1370 effective samples
(Kish's count over the runs), and the failures of the old tolerance (over all samples) were
py-spy alone inflating one function (``Scene.colour`` 18.2 % against 10.0 %, ``Vector.__init__``
12.6 against 6.1) while ours stayed at the quiet run's shares.  So the tolerance is 2.5 standard
errors of the difference of two shares over the effective counts (3.1-3.9 points quiet, 4-7 at
load 6), held between 3 and 10 points: with two suites running beside it, py-spy was once left
81-189 effective samples on richards in three attempts in a row, where the shares still agreed
within 4.7-6.9 points, and the thread-mode sampler this replaces was 15-20 points off on
raytrace on every run, which no repetition or widening hides.  Up to three attempts are made.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable

import pytest

from stepscope.collectors.sampler import Sampler, add_samples
from stepscope.trace.model import TraceBuilder
from tests.pure_python_workloads import permutations, queens, run_for
from tests.sampler_agreement import ANCHOR, Agreement, measure
from tests.test_sampling import needs_py_spy

pytestmark = pytest.mark.slow

SECONDS = 4.0
TOLERANCE = 0.03
MOST = 0.10  # the widest tolerance: the thread-mode sampler this guards against was 15-20 off
ATTEMPTS = 3


def agreement(workload: str) -> Agreement:
    result = measure(workload, SECONDS, 1000, py_spy_rate_hz=500)
    if result.mode != "signal":
        pytest.skip("signal sampling is unavailable here")
    return result


def tolerance(result: Agreement) -> float:
    """2.5 standard errors of the difference of two shares of about 25 %, over the effective
    sample counts, held between 3 and 10 points."""
    spread = math.sqrt(0.25 * 0.75 * (1 / result.our_effective + 1 / result.their_effective))
    return min(MOST, max(TOLERANCE, 2.5 * spread))


def agrees(result: Agreement) -> bool:
    """The two samplers' shares are within the tolerance."""
    return result.max_abs_diff <= tolerance(result)


@needs_py_spy
@pytest.mark.parametrize(
    ("workload", "hot"),
    [
        ("richards", "System.run"),
        ("raytrace", "Sphere.intersectionTime"),
        ("nqueens", "permutations"),
    ],
)
def test_self_shares_agree_with_py_spy_on_the_same_run(workload: str, hot: str) -> None:
    tries = [agreement(workload)]
    while not agrees(tries[-1]) and len(tries) < ATTEMPTS:
        tries.append(agreement(workload))
    result = tries[-1]
    seen = "; ".join(
        f"{t.our_samples} ours ({t.our_effective:.0f} effective), {t.their_samples} py-spy's "
        f"({t.their_effective:.0f}), {100 * t.max_abs_diff:.1f} of {100 * tolerance(t):.1f} points"
        for t in tries
    )
    assert agrees(result), f"{seen}\n{result.table()}"
    assert hot in result.top and hot in result.ours, result.table()


def _cpu_ns(work: Callable[[], object]) -> int:
    start = time.thread_time_ns()  # this thread's CPU time: a preemption by the load is not in it
    work()
    return time.thread_time_ns() - start


def _all_permutations() -> None:
    for _ in permutations(range(8)):
        pass


def test_generator_shares_match_a_differential_cpu_timing() -> None:
    """nqueens (issue 36, item 7: ours 57.8 % permutations against py-spy's 48.2 %, from two
    separate runs).  Measured without a sampler, permutations and the generator expression it
    builds tuples with take 62-64 % of the solver's CPU time (the generator consumed alone
    against the whole solver, medians of interleaved runs); the sampler's share of stacks that
    hold ``permutations`` must be that.  (On one run both samplers agree within 1.5-3.9 points;
    separate runs at load 5 on two cores spread 51-60 % for either sampler's self share, so the
    issue's 9.6 points were two runs' noise, not a bias.)"""
    whole, alone = [], []
    for _ in range(15):
        whole.append(_cpu_ns(queens))
        alone.append(_cpu_ns(_all_permutations))
    expected = statistics.median(alone) / statistics.median(whole)
    sampler = Sampler(1000, thread_ids=[threading.get_native_id()], seed=11)
    sampler.start()
    assert sampler.wait_running(5)
    run_for("nqueens", 3.0)
    data = sampler.stop(5)
    builder = TraceBuilder()
    add_samples(builder, data, os.getpid())
    stacks = [s.stack for s in builder.build().iter_samples() if ANCHOR in s.stack]
    inside = sum(1 for stack in stacks if "permutations" in stack)
    share = inside / len(stacks)
    # 2.5 standard errors of a sampled share (the timed share's own spread is ~1 point), at
    # least 4 points
    tolerance = max(0.04, 2.5 * math.sqrt(expected * (1 - expected) / len(stacks)))
    assert len(stacks) >= 300, sampler.describe(data)
    assert abs(share - expected) <= tolerance, (
        f"sampled {100 * share:.1f} % of {len(stacks)} samples in permutations, "
        f"timed {100 * expected:.1f} %"
    )
