"""Profiler overheads beside torch.profiler: a step in NONE, record_function inactive and active.

Targets (issue 3): a NONE step <= 2 us; record_function enter+exit <= 200 ns with no window
recording (torch's costs ~5.9 us here).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import stepscope
from harness import Report


def _loop_cost(report: Report, case: str, subject: str, body: Callable[[], None], n: int) -> float:
    """ns per iteration of ``body`` (a loop of n iterations) minus the empty loop."""

    def empty() -> None:
        for _ in range(n):
            pass

    base = report.measure(f"{case} (empty loop)", subject, empty, per_call=n, repeat=5)
    result = report.measure(case, subject, body, per_call=n, repeat=5)
    return result.median - base.median


def _steps(prof: Any, n: int) -> Callable[[], None]:
    def loop() -> None:
        for _ in range(n):
            prof.step()

    return loop


def run(report: Report) -> None:
    """Run the profiler benchmarks."""
    n = 20_000 if report.quick else 200_000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        never = stepscope.schedule(wait=10**9, warmup=1, active=1)

    # -- a step in NONE ---------------------------------------------------------------------
    prof = stepscope.profile(schedule=never)
    prof.start()
    ours_step = _loop_cost(report, "step() in NONE", "stepscope", _steps(prof, n), n)
    prof.stop()
    report.target("stepscope step() in NONE <= 2000 ns", ours_step, 2000)

    # -- record_function with nothing recording ----------------------------------------------
    rf = stepscope.record_function

    def ours_inactive() -> None:
        for _ in range(n):
            with rf("block"):
                pass

    ours_rf = _loop_cost(report, "record_function, no window", "stepscope", ours_inactive, n)
    report.target("stepscope record_function inactive <= 200 ns", ours_rf, 200)

    # -- record_function while recording -------------------------------------------------------
    active = stepscope.profile(max_annotation_spans=0)
    active.start()
    ours_active = _loop_cost(report, "record_function, recording", "stepscope", ours_inactive, n)
    active.stop()

    try:
        import torch
        from torch.autograd.profiler import record_function as torch_rf
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler import schedule as torch_schedule
    except ImportError:
        report.note("torch not installed: torch comparison skipped")
        return
    del torch

    def theirs_inactive() -> None:
        for _ in range(n):
            with torch_rf("block"):
                pass

    torch_rf_cost = _loop_cost(report, "record_function, no window", "torch", theirs_inactive, n)
    report.note(
        f"record_function inactive: stepscope {ours_rf:.0f} ns, torch {torch_rf_cost:.0f} ns, "
        f"ratio {ours_rf / torch_rf_cost:.3f}"
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tprof = profile(
            activities=[ProfilerActivity.CPU],
            schedule=torch_schedule(wait=10**9, warmup=1, active=1),
        )
    tprof.start()
    torch_step = _loop_cost(report, "step() in NONE", "torch", _steps(tprof, n), n)
    tprof.stop()
    report.note(
        f"step() in NONE: stepscope {ours_step:.0f} ns, torch {torch_step:.0f} ns, "
        f"ratio {ours_step / torch_step:.3f}"
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU]):
            torch_active = _loop_cost(
                report, "record_function, recording", "torch", theirs_inactive, n
            )
    report.note(
        f"record_function recording: stepscope {ours_active:.0f} ns, torch "
        f"{torch_active:.0f} ns, ratio {ours_active / torch_active:.3f}"
    )
