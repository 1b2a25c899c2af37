"""A known workload for the samplers: 70% of its time in ``hot``, 30% in ``cold``."""

from __future__ import annotations

import time


def hot(n: int) -> int:
    """A busy loop of n iterations."""
    total = 0
    for i in range(n):
        total += i * i
    return total


def cold(n: int) -> int:  # the same body as hot: per-iteration cost is equal
    """The same busy loop under another name."""
    total = 0
    for i in range(n):
        total += i * i
    return total


def workload(seconds: float) -> str:
    """Spends 70% of its time in hot() and 30% in cold()."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        hot(7000)
        cold(3000)
    return "done"
