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


def _cpu_s_per_round() -> float:
    """One round's CPU time, measured once on the thread's CPU clock (which load does not
    stretch)."""
    rounds = 40
    began = time.thread_time()
    for _ in range(rounds):
        hot(7000)
        cold(3000)
    return max(time.thread_time() - began, 1e-6) / rounds


_CPU_S_PER_ROUND = _cpu_s_per_round()
_last_cpu_share = [1.0]


def workload(seconds: float, cpu: bool = False) -> str:
    """Spends 70% of its time in hot() and 30% in cold(): ``seconds`` of the wall clock, or with
    ``cpu`` that much CPU time however long the machine's load makes it (a fixed number of
    rounds: no clock read inside, whose system call would be where a loaded kernel preempts)."""
    began_cpu, began = time.thread_time(), time.perf_counter()
    if cpu:
        for _ in range(max(1, round(seconds / _CPU_S_PER_ROUND))):
            hot(7000)
            cold(3000)
    else:
        end = began + seconds
        while time.perf_counter() < end:
            hot(7000)
            cold(3000)
    _last_cpu_share[0] = (time.thread_time() - began_cpu) / (time.perf_counter() - began)
    return "done"


def last_cpu_share() -> float:
    """The share of the last workload's wall time its thread spent on a CPU."""
    return _last_cpu_share[0]
