"""Whether B's steps are slower than A's beyond the run-to-run spread, from the steps themselves.

Two measures, both from the step times of the two runs:

- **The shift and its interval.**  The shift is the Hodges-Lehmann estimate (the median of
  every difference ``b - a`` between a step of B and a step of A); its interval is the
  distribution-free one of the Mann-Whitney test (normal approximation, ``CONFIDENCE``), so a
  few outlying steps move neither.
- **The drift within a run.**  Steps of one run are not independent draws: the machine's load
  and clock change while it runs, and between runs.  Each run's steps are cut into consecutive
  blocks (``BLOCKS``); half the range of the block medians is how far a run's typical step wanders
  on its own.  Two runs of the same program differ by about the two drifts together (their
  root sum of squares).

A change is *beyond the spread* when the whole interval lies on one side of zero and the
shift is larger than the two runs' drift together.  ``MIN_STEPS`` steps per run are needed
for an answer.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BLOCKS",
    "CONFIDENCE",
    "MAX_STEPS",
    "MIN_STEPS",
    "StepChange",
    "drift_ns",
    "step_change",
]

CONFIDENCE = 0.99
"""Two-sided confidence of the shift's interval."""
BLOCKS = 4
"""Consecutive blocks a run's steps are cut into to measure its drift (2 under 12 steps)."""
MIN_STEPS = 3
MAX_STEPS = 600
"""Steps per run the shift is computed from (evenly spaced): its cost grows as their product."""


@dataclass(frozen=True)
class StepChange:
    """B's step times against A's: the shift, its interval, the drift, and the verdict."""

    shift_ns: int
    """Hodges-Lehmann shift: the median of the differences B step - A step."""
    low_ns: int
    high_ns: int
    """The shift's interval at ``CONFIDENCE``."""
    drift_ns: int
    """The two runs' drifts together (root sum of squares of half the range of each run's
    block medians)."""
    beyond_spread: bool
    """The interval excludes zero and the shift exceeds the drift."""
    known: bool
    """False when a run has fewer than ``MIN_STEPS`` steps (then nothing is beyond)."""


def drift_ns(durations: Sequence[int]) -> int:
    """Half the range of the medians of consecutive blocks of a run's steps (0 under 4)."""
    n = len(durations)
    blocks = BLOCKS if n >= 3 * BLOCKS else 2
    if n < 2 * blocks:
        return 0
    medians = [
        statistics.median(durations[k * n // blocks : (k + 1) * n // blocks]) for k in range(blocks)
    ]
    return int((max(medians) - min(medians)) / 2)


def _thinned(durations: Sequence[int]) -> Sequence[int]:
    n = len(durations)
    if n <= MAX_STEPS:
        return durations
    return [durations[k * n // MAX_STEPS] for k in range(MAX_STEPS)]


def _z(confidence: float) -> float:
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)


def step_change(a: Sequence[int], b: Sequence[int]) -> StepChange:
    """Compare B's step durations (in run order) with A's."""
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return StepChange(0, 0, 0, 0, False, False)
    a_used, b_used = _thinned(a), _thinned(b)
    n, m = len(a_used), len(b_used)
    differences = sorted(y - x for x in a_used for y in b_used)
    total = len(differences)
    shift = int(statistics.median(differences))
    # Mann-Whitney: the k-th smallest and largest differences bound the shift
    k = math.floor(total / 2 - _z(CONFIDENCE) * math.sqrt(n * m * (n + m + 1) / 12))
    k = max(0, min(k, (total - 1) // 2))
    low, high = differences[k], differences[total - 1 - k]
    drift = round(math.hypot(drift_ns(a), drift_ns(b)))
    known = len(a) >= MIN_STEPS and len(b) >= MIN_STEPS
    beyond = known and (low > 0 or high < 0) and abs(shift) > drift
    return StepChange(shift, low, high, drift, beyond, known)
