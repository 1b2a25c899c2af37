"""The device breakdown equals HTA's on every shared GPU trace (within 0.5 percentage points)."""

from __future__ import annotations

import logging
import shutil
import warnings
from typing import Any

import pytest

from stepscope.analysis.device import device_breakdowns, device_events, hta_selection
from stepscope.trace import read_chrome_trace
from tests.analysis_helpers import SHARED

GPU_TRACES = [
    "alexnet_gpu.json.gz",
    "amd_mi250_rocm.json.gz",
    "et_simple_add_trace.json.gz",
    "mtia_inference.json.gz",
    "nccl_gpu.json.gz",
    "simple_add_gpu.json.gz",
    "training_rank0_gpu.json.gz",
    "triton_gpu.json.gz",
]
TOLERANCE_PP = 0.5

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SHARED.is_dir(), reason="shared GPU traces not present"),
]


@pytest.fixture(scope="module")
def hta_results(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Any]:
    """HTA's temporal and kernel-type breakdowns of each trace (copied first), both modes."""
    hta = pytest.importorskip("hta.trace_analysis")
    folder = tmp_path_factory.mktemp("hta")
    results: dict[tuple[str, bool], Any] = {}
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in GPU_TRACES:
                copy = folder / name
                shutil.copyfile(SHARED / name, copy)
                for last in (False, True):
                    analysis = hta.TraceAnalysis(
                        trace_files={0: str(copy)},
                        trace_dir=str(folder),
                        include_last_profiler_step=last,
                    )
                    temporal = analysis.get_temporal_breakdown(visualize=False)
                    with_mem, _ = analysis.get_gpu_kernel_breakdown(
                        visualize=False, include_memory_kernels=True
                    )
                    no_mem, _ = analysis.get_gpu_kernel_breakdown(
                        visualize=False, include_memory_kernels=False
                    )
                    results[(name, last)] = (
                        temporal.to_dict("records")[0],
                        dict(zip(with_mem["kernel_type"], with_mem["percentage"], strict=True)),
                        dict(zip(no_mem["kernel_type"], no_mem["percentage"], strict=True)),
                    )
    finally:
        logging.disable(logging.NOTSET)
    return results


@pytest.mark.parametrize("include_last_step", [False, True])
@pytest.mark.parametrize("name", GPU_TRACES)
def test_device_breakdown_equals_hta(
    name: str, include_last_step: bool, hta_results: dict[tuple[str, bool], Any]
) -> None:
    temporal, with_mem, no_mem = hta_results[(name, include_last_step)]
    trace = read_chrome_trace(SHARED / name)
    events = device_events(trace)
    positions = hta_selection(trace, events, include_last_step)
    ours = device_breakdowns(events, positions, "test")[0]
    assert ours.span_ns / 1000 == pytest.approx(temporal["kernel_time(us)"], abs=2)
    assert abs(ours.idle_pct - temporal["idle_time_pctg"]) <= TOLERANCE_PP
    assert abs(ours.compute_pct - temporal["compute_time_pctg"]) <= TOLERANCE_PP
    assert abs(ours.non_compute_pct - temporal["non_compute_time_pctg"]) <= TOLERANCE_PP
    for theirs, mine in ((with_mem, ours.kernel_types), (no_mem, ours.kernel_types_no_memory)):
        shares = {k.kernel_type: k.pct for k in mine}
        for kind in set(theirs) | set(shares):
            assert abs(shares.get(kind, 0.0) - theirs.get(kind, 0.0)) <= TOLERANCE_PP, kind
    # the slices add up: idle + compute + non-compute is the span
    assert ours.idle_ns + ours.compute_ns + ours.non_compute_ns == ours.span_ns


def test_kernel_types_follow_hta_names() -> None:
    from stepscope.analysis.device import kernel_type

    assert kernel_type("ncclKernel_AllReduce_RING_LL_Sum_float") == "COMMUNICATION"
    assert kernel_type("Memcpy HtoD (Pageable -> Device)") == "MEMORY"
    assert kernel_type("Memset (Device)") == "MEMORY"
    assert kernel_type("Stream Sync") == "OTHER"
    assert kernel_type("void at::native::vectorized_elementwise_kernel<4>") == "COMPUTATION"
