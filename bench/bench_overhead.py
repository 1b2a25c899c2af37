"""The overhead every report states: the step recorder's own cost, and the stated slowdown
against an external A/B, beside torch.profiler (which states none) on the same loop.

Targets (issue 26): the step recorder costs a few ns per step (here: begin + end, with its
clock reads); the stated slowdown agrees with the external A/B within max(5 points, 25 %).
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable

import stepscope
from harness import Report
from stepscope.analysis.analyze import analyze_trace
from stepscope.step_times import StepTimes

WAIT, WARMUP, ACTIVE = 8, 1, 8


def _leaf(x: int) -> int:
    return x + 1


def _call_heavy() -> None:
    total = 0
    for i in range(5000):
        total = _leaf(total) + _leaf(i)


def _bodies(body: Callable[[], None], n: int) -> list[int]:
    times = []
    for _ in range(n):
        began = time.perf_counter_ns()
        body()
        times.append(time.perf_counter_ns() - began)
    return times


def _recorded_bodies(body: Callable[[], None], step: Callable[[], object]) -> list[int]:
    """The loop under a profile's schedule: each recorded step's body time (ns)."""
    recorded: list[int] = []
    for n in range(WAIT + WARMUP + ACTIVE):
        began = time.perf_counter_ns()
        body()
        if n >= WAIT + WARMUP:
            recorded.append(time.perf_counter_ns() - began)
        step()
    return recorded


def _stepscope_ab(body: Callable[[], None]) -> tuple[float, float]:
    """(stated slowdown %, external slowdown %) of recorded steps under with_stack."""
    baseline = _bodies(body, WAIT + ACTIVE)
    sched = stepscope.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    with stepscope.profile(schedule=sched, with_stack=True, torch_ops=False) as prof:
        recorded = _recorded_bodies(body, prof.step)
    overhead = analyze_trace(prof.trace()).overhead
    stated = overhead.slowdown_pct if overhead is not None else None
    external = 100.0 * (statistics.median(recorded) / statistics.median(baseline) - 1)
    return (stated if stated is not None else float("nan")), external


def _torch_external(body: Callable[[], None]) -> float | None:
    try:
        import torch.profiler as tp
    except ImportError:
        return None
    baseline = _bodies(body, WAIT + ACTIVE)
    sched = tp.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    with tp.profile(schedule=sched, with_stack=True, activities=[tp.ProfilerActivity.CPU]) as prof:
        recorded = _recorded_bodies(body, prof.step)
    return 100.0 * (statistics.median(recorded) / statistics.median(baseline) - 1)


def run(report: Report) -> None:
    """Run the overhead benchmarks."""
    n = 20_000 if report.quick else 200_000

    def hook(times: StepTimes) -> Callable[[], None]:
        begin, end = times.begin, times.end

        def loop() -> None:
            for _ in range(n):
                begin(0)
                end()

        return loop

    def empty() -> None:
        for _ in range(n):
            pass

    base = report.measure("empty loop", "python", empty, per_call=n, repeat=5)
    for implementation in ("native", "python"):
        try:
            times = StepTimes(capacity=1024, implementation=implementation)
        except RuntimeError as exc:  # no extension built
            report.note(f"step recorder ({implementation}): {exc}")
            continue
        ours = report.measure(
            f"step recorder begin+end ({implementation})",
            "stepscope",
            hook(times),
            per_call=n,
            repeat=5,
        )
        if implementation == "native":
            report.target("step recorder ns per step, C (<= 100)", ours.median - base.median, 100)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stated, external = _stepscope_ab(_call_heavy)
    report.add("call-heavy, with_stack: stated", "stepscope", "%", [stated])
    report.add("call-heavy, with_stack: external A/B", "stepscope", "%", [external])
    report.target(
        "|stated - external| within max(5 points, 25 %) (as a share of the margin)",
        abs(stated - external) / max(5.0, 0.25 * abs(external)),
        1.0,
    )
    torch_external = _torch_external(_call_heavy)
    if torch_external is not None:
        report.add("call-heavy, with_stack: external A/B", "torch.profiler", "%", [torch_external])
        report.note("torch.profiler states no overhead figure; its external A/B is beside ours")
