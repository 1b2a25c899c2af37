"""The in-process sampler attributes self time as py-spy does (issue 12, point 4).

Both sample the same execution at once (py-spy from outside, pausing the process 500 times a
second; the in-process sampler at 1 kHz), so what is left between them is sampling noise: about
1.2 percentage points of standard error per function at ~2000 samples each, against the 3-point
tolerance.  A measurement over the tolerance is repeated once before failing: the thread-mode
sampler this replaces was 15-20 points off on raytrace, which no repetition hides.
"""

from __future__ import annotations

import pytest

from tests.sampler_agreement import Agreement, measure
from tests.test_sampling import needs_py_spy

SECONDS = 4.0
TOLERANCE = 0.03


def agreement(workload: str) -> Agreement:
    result = measure(workload, SECONDS, 1000, py_spy_rate_hz=500)
    if result.mode != "signal":
        pytest.skip("signal sampling is unavailable here")
    assert result.our_samples >= 1000 and result.their_samples >= 1000, result
    return result


@needs_py_spy
@pytest.mark.parametrize(
    ("workload", "hot"),
    [("richards", "System.run"), ("raytrace", "Sphere.intersectionTime")],
)
def test_self_shares_agree_with_py_spy_on_the_same_run(workload: str, hot: str) -> None:
    result = agreement(workload)
    if result.max_abs_diff > TOLERANCE:
        result = agreement(workload)
    assert result.max_abs_diff <= TOLERANCE, result.table()
    assert hot in result.top and hot in result.ours, result.table()
