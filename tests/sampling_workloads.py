"""A known workload for the samplers: 70% of its time in ``hot``, 30% in ``cold``."""

from __future__ import annotations

import time
from collections.abc import Callable


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


_last_cpu_share = [1.0]


def workload(seconds: float, clock: Callable[[], float] = time.perf_counter) -> str:
    """Spends 70% of its time in hot() and 30% in cold(), for ``seconds`` of ``clock`` (the
    wall clock; ``time.thread_time``: the thread's CPU time, however long the machine's load
    makes that)."""
    began_cpu, began = time.thread_time(), time.perf_counter()
    end = clock() + seconds
    while clock() < end:
        hot(7000)
        cold(3000)
    _last_cpu_share[0] = (time.thread_time() - began_cpu) / (time.perf_counter() - began)
    return "done"


def last_cpu_share() -> float:
    """The share of the last workload's wall time its thread spent on a CPU."""
    return _last_cpu_share[0]
