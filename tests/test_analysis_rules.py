"""Each recommendation rule: a trace that fires it (with its evidence) and one that does not."""

from __future__ import annotations

from stepscope.analysis.analyze import analyze_trace
from stepscope.trace.model import Trace
from tests.analysis_helpers import Kernel, StepSpec, build


def rules(trace: Trace) -> dict[str, dict[str, object]]:
    return {r.rule: r.evidence for r in analyze_trace(trace).recommendations}


def loop(data_us: int, steps: int = 4) -> Trace:
    return build(
        [
            StepSpec(
                1000,
                [
                    ("data_loading", 0, data_us, "user_annotation"),
                    ("forward", data_us, 1000 - data_us - 10, "user_annotation"),
                ],
            )
            for _ in range(steps)
        ]
    )


def test_data_loading_fires_over_5_percent() -> None:
    evidence = rules(loop(200))["data_loading"]
    assert evidence["data_loading_pct"] == 20.0


def test_data_loading_quiet_under_5_percent() -> None:
    assert "data_loading" not in rules(loop(30))


def _loader(iterator: str) -> Trace:
    name = f"enumerate(DataLoader)#{iterator}.__next__"
    return build(
        [
            StepSpec(
                1000,
                [(name, 0, 400, "user_annotation"), ("forward", 400, 590, "user_annotation")],
            )
            for _ in range(4)
        ]
    )


def test_a_loader_with_workers_is_not_told_to_use_workers() -> None:
    # issue 36, point 5: a DataLoader with num_workers=2 was told "num_workers>0"
    [with_workers] = [
        r
        for r in analyze_trace(_loader("_MultiProcessingDataLoaderIter")).recommendations
        if r.rule == "data_loading"
    ]
    assert with_workers.evidence["worker_processes"] is True
    assert "num_workers>0" not in with_workers.advice
    assert "already loads in worker processes" in with_workers.advice
    [single] = [
        r
        for r in analyze_trace(_loader("_SingleProcessDataLoaderIter")).recommendations
        if r.rule == "data_loading"
    ]
    assert single.evidence["worker_processes"] is False
    assert "num_workers>0" in single.advice


def busy_gpu(gap_us: int, launch_late: bool, count: int = 4) -> Trace:
    """Steps of 1000 µs at 1000 µs; kernels every (dur + gap) µs inside them."""
    kernels = []
    t = 1000
    for i in range(count):
        launch = t - 5 if launch_late else 1000 + i
        kernels.append(Kernel("gemm_kernel", t, 1000 - gap_us, launch))
        t += 1000
    return build([StepSpec(1000) for _ in range(count)], kernels)


def test_gpu_idle_fires_over_30_percent() -> None:
    evidence = rules(busy_gpu(500, launch_late=False))["gpu_idle"]
    assert evidence["device_idle_pct"] == 50.0


def test_gpu_idle_quiet_when_busy() -> None:
    assert "gpu_idle" not in rules(busy_gpu(100, launch_late=False))


def test_host_bound_fires_when_kernels_wait_for_launches() -> None:
    evidence = rules(busy_gpu(500, launch_late=True))["host_bound"]
    assert evidence["host_wait_share_pct"] == 100.0


def test_host_bound_quiet_when_launches_are_early() -> None:
    found = rules(busy_gpu(500, launch_late=False))
    assert "gpu_idle" in found and "host_bound" not in found


def short_kernel_trace(dur_us: int) -> Trace:
    kernels = [Kernel("add_kernel", 1000 + i * 9, dur_us, 1000) for i in range(110)]
    return build([StepSpec(2000)], kernels)


def test_short_kernels_fire() -> None:
    evidence = rules(short_kernel_trace(5))["short_kernels"]
    assert evidence["device_events_per_step"] == 110 and evidence["short_pct"] == 100.0


def test_short_kernels_quiet_for_long_kernels() -> None:
    assert "short_kernels" not in rules(short_kernel_trace(50))


def comm_trace(overlapped: bool) -> Trace:
    kernels = [Kernel("gemm_kernel", 1000, 400, 1000)]
    start = 1100 if overlapped else 1500
    kernels.append(Kernel("ncclKernel_AllReduce_RING", start, 300, 1001, stream=20))
    return build([StepSpec(1000)], kernels)


def test_exposed_communication_fires() -> None:
    evidence = rules(comm_trace(False))["communication_exposed"]
    assert evidence["communication_ms"] == 0.3 and evidence["overlapped_pct_of_communication"] == 0


def test_exposed_communication_quiet_when_overlapped() -> None:
    assert "communication_exposed" not in rules(comm_trace(True))


def copies(name: str) -> Trace:
    kernels = [Kernel(name, 1000 + 20 * i, 10, 1000 + 20 * i) for i in range(12)]
    return build([StepSpec(1000)], kernels)


def test_pageable_copies_fire() -> None:
    evidence = rules(copies("Memcpy HtoD (Pageable -> Device)"))["pageable_h2d"]
    assert evidence["count"] == 12


def test_pinned_copies_quiet() -> None:
    assert "pageable_h2d" not in rules(copies("Memcpy HtoD (Pinned -> Device)"))


def test_step_outliers_fire_and_quiet() -> None:
    slow = build([StepSpec(1000), StepSpec(1000), StepSpec(1000), StepSpec(2000)])
    evidence = rules(slow)["step_outliers"]
    assert evidence["slowest_step"] == 3 and evidence["ratio"] == 2.0
    even = build([StepSpec(1000), StepSpec(1000), StepSpec(1100), StepSpec(1200)])
    assert "step_outliers" not in rules(even)


def test_dropped_events_fire_and_quiet() -> None:
    meta: dict[str, object] = {
        "stepscope_python_tracer": {"dropped_events": 42, "event_budget": 10}
    }
    evidence = rules(build([StepSpec(1000)], metadata=meta))["dropped_events"]
    assert evidence == {"python_tracer_dropped_calls": 42}
    assert "dropped_events" not in rules(build([StepSpec(1000)]))


def test_cpu_only_trace_fires_no_device_rule() -> None:
    found = rules(loop(30))
    assert not set(found) & {"gpu_idle", "host_bound", "short_kernels", "pageable_h2d"}
