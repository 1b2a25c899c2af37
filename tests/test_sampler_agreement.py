"""The in-process sampler attributes self time as py-spy does (issue 12, point 4).

Both sample the same execution at once (py-spy from outside, pausing the process 500 times a
second; the in-process sampler at 1 kHz), so what is left between them is sampling noise: about
1.2 percentage points of standard error per function at ~2000 samples each, against the 3-point
tolerance.  A loaded machine lets both take fewer samples: the tolerance then widens with the
standard error of the difference of two shares (never below 3 points).  A measurement over the
tolerance is repeated, up to three in all, before failing: at load 5 on two cores one pair of
runs was 7 points apart on raytrace's ``Vector.dot`` twice (the samplers see a process that is
mostly descheduled differently), while the thread-mode sampler this replaces was 15-20 points
off on raytrace on every run, which no repetition hides.
"""

from __future__ import annotations

import math

import pytest

from tests.sampler_agreement import Agreement, measure
from tests.test_sampling import needs_py_spy

SECONDS = 4.0
TOLERANCE = 0.03


def agreement(workload: str) -> Agreement:
    result = measure(workload, SECONDS, 1000, py_spy_rate_hz=500)
    if result.mode != "signal":
        pytest.skip("signal sampling is unavailable here")
    assert result.our_samples >= 300 and result.their_samples >= 300, result
    return result


def tolerance(result: Agreement) -> float:
    """3 points, or 2.5 standard errors of the difference of two shares of about 25 %."""
    spread = math.sqrt(0.25 * 0.75 * (1 / result.our_samples + 1 / result.their_samples))
    return max(TOLERANCE, 2.5 * spread)


@needs_py_spy
@pytest.mark.parametrize(
    ("workload", "hot"),
    [("richards", "System.run"), ("raytrace", "Sphere.intersectionTime")],
)
def test_self_shares_agree_with_py_spy_on_the_same_run(workload: str, hot: str) -> None:
    result = agreement(workload)
    for _ in range(2):
        if result.max_abs_diff <= tolerance(result):
            break
        result = agreement(workload)
    assert result.max_abs_diff <= tolerance(result), result.table()
    assert hot in result.top and hot in result.ours, result.table()
