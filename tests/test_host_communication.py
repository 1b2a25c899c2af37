"""Only collectives are communication: ``aten::broadcast_tensors`` and ``broadcast_to`` are shape
operators that move no data between processes (issue 36, item 7: 0.7 % communication on an RL
program with no process group)."""

from __future__ import annotations

import pytest

from stepscope.analysis.analyze import analyze_trace
from stepscope.analysis.host import classify_name
from stepscope.trace.model import TraceBuilder

# names torch 2.13's profiler gives, read from a gloo run of dist.broadcast / all_reduce /
# barrier / functional broadcast beside torch.broadcast_tensors and Tensor.broadcast_to
COLLECTIVES = [
    "c10d::broadcast_",
    "c10d::allreduce_",
    "c10d::barrier",
    "gloo:broadcast",
    "gloo:all_reduce",
    "gloo:barrier",
    "nccl:broadcast",
    "nccl:all_reduce",
    "record_param_comms",
    "_c10d_functional::broadcast",
    "_c10d_functional::wait_tensor",
    "torch/distributed/distributed_c10d.py(2715): broadcast",
]
SHAPE_OPERATORS = [
    "aten::broadcast_tensors",
    "aten::broadcast_to",
    "torch/functional.py(77): broadcast_tensors",
    "torch/functional.py(132): broadcast_shapes",
]


@pytest.mark.parametrize("name", COLLECTIVES)
def test_collectives_are_communication(name: str) -> None:
    assert classify_name(name) == "communication"


@pytest.mark.parametrize("name", SHAPE_OPERATORS)
def test_broadcasting_shapes_is_not_communication(name: str) -> None:
    assert classify_name(name) != "communication"


def test_a_step_broadcasting_tensors_has_no_communication() -> None:
    b = TraceBuilder(base_time_ns=0)
    for n in range(3):
        at = 10_000 * n
        b.span(f"ProfilerStep#{n}", "user_annotation", 1, 1, at, 10_000)
        b.span("aten::broadcast_tensors", "cpu_op", 1, 1, at + 1000, 700)
        b.span("aten::expand", "cpu_op", 1, 1, at + 1100, 300)
        b.span("gloo:broadcast", "cpu_op", 1, 1, at + 5000, 2000)
    for step in analyze_trace(b.build()).host_steps:
        shares = {c.name: c.ns for c in step.categories}
        assert shares["communication"] == 2000, shares  # the gloo broadcast, not the 700 ns
        assert shares["forward"] == 700, shares  # an operator before any backward
