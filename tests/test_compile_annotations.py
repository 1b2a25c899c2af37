"""stepscope annotations inside torch.compile: no graph break, as torch's record_function."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from tests.test_annotations import record_function_of

torch = pytest.importorskip("torch")
dynamo = pytest.importorskip("torch._dynamo")

import stepscope  # noqa: E402

pytestmark = pytest.mark.slow


def annotated_with(make: Callable[..., Any]) -> Callable[[Any], Any]:
    def body(x: Any) -> Any:
        with make("## block ##", "1, 2"):
            y = x.sin() + 1
        return y.cos()

    return body


def counts(fn: Callable[[Any], Any]) -> tuple[int, int, list[int]]:
    """(graphs compiled, graph breaks, ops in each graph) of one Dynamo trace of ``fn``."""
    dynamo.reset()
    explained = dynamo.explain(fn)(torch.randn(4))
    ops = [len(graph_ops) for graph_ops in explained.ops_per_graph or []]
    return explained.graph_count, explained.graph_break_count, ops


def test_context_manager_compiles_like_torch(implementation: str) -> None:
    make = record_function_of(implementation)
    reference = counts(annotated_with(torch.profiler.record_function))
    assert reference[:2] == (1, 0)  # torch's own annotation: one graph, no break
    assert counts(annotated_with(make)) == reference
    with stepscope.profile(torch_ops=False):  # a recording window changes nothing
        assert counts(annotated_with(make)) == reference


def test_decorator_and_fullgraph(implementation: str) -> None:
    make = record_function_of(implementation)

    def double(x: Any) -> Any:
        return x * 2

    inner = make("## decorated ##")(double)

    def outer(x: Any) -> Any:
        return inner(x) + 1

    dynamo.reset()
    x = torch.randn(8)
    compiled = torch.compile(outer, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), outer(x))
    compiled_cm = torch.compile(annotated_with(make), backend="aot_eager", fullgraph=True)
    assert torch.allclose(compiled_cm(x), annotated_with(make)(x))


def compiled_event_names(make: Callable[..., Any]) -> list[str]:
    """torch.profiler's event names for one call of the inductor-compiled body."""
    dynamo.reset()
    compiled = torch.compile(annotated_with(make))
    x = torch.randn(16)
    compiled(x)  # compile outside the profile
    with torch.profiler.profile() as prof:
        out = compiled(x)
    # inductor's vectorized sin/cos differ from aten's by ~1e-7: allclose's atol of 1e-8 failed
    # on an output near zero (-0.0078) with some random inputs; torch's own float32 tolerance
    torch.testing.assert_close(out, annotated_with(make)(x))
    # the compiled graph's name carries a hash of its code
    return sorted(re.sub(r"CompiledFxGraph \w+", "CompiledFxGraph", e.name) for e in prof.events())


def test_inductor_runs_the_annotated_body_as_torch_does() -> None:
    """One real inductor compile: torch.profiler sees the same events as with torch's own."""
    names = compiled_event_names(stepscope.record_function)
    assert "Torch-Compiled Region: 0/0" in names
    assert names == compiled_event_names(torch.profiler.record_function)


# -- a profile built inside a compiled function --------------------------------------------------


def profiled_with(make: Callable[..., Any], **options: Any) -> Callable[[Any], Any]:
    def body(x: Any) -> Any:
        y = x.sin()
        with make(**options):
            z = y.cos() + 1
        return z * 2

    return body


def compiled_counts(make: Callable[..., Any], **options: Any) -> tuple[int, int, list[int]]:
    """(frames Dynamo compiled, graph breaks, ops in each graph) of one compile of
    ``profiled_with(make)``; its result is checked against the eager run's."""
    from torch._dynamo.utils import counters as dynamo_counters

    dynamo.reset()
    dynamo_counters.clear()
    ops: list[int] = []

    def backend(gm: Any, example_inputs: Any) -> Any:
        ops.append(sum(node.op in ("call_function", "call_method") for node in gm.graph.nodes))
        return gm.forward

    body = profiled_with(make, **options)
    x = torch.randn(8)
    out = torch.compile(body, backend=backend)(x)
    torch.testing.assert_close(out, body(x))
    frames = dynamo_counters["frames"]["total"]
    breaks = sum(dynamo_counters["graph_break"].values())
    return frames, breaks, ops


def test_a_profile_built_in_a_compiled_function_compiles_as_torchs() -> None:
    """Dynamo ignores torch.profiler.profile there (a nullcontext): the whole body is one graph.
    Traced into, stepscope's constructor broke the graph and the rest of the body ran eagerly
    (with Dynamo compiling every frame the profile itself ran: 214 frames where torch's is 1)."""
    reference = compiled_counts(torch.profiler.profile)
    assert reference == (1, 0, [4])  # sin, cos, add, mul
    assert compiled_counts(stepscope.profile) == reference
    options = {"record_shapes": True, "schedule": stepscope.schedule(wait=0, warmup=0, active=1)}
    assert compiled_counts(stepscope.profile, **options) == reference
    # eagerly it is a profile as before, and its signature is still its __init__'s
    prof = stepscope.profile(torch_ops=False)
    assert type(prof) is stepscope.profile and prof.step_num == 0
    parameters = inspect.signature(stepscope.profile).parameters
    assert list(parameters)[:3] == ["activities", "schedule", "on_trace_ready"]
    assert set(inspect.signature(torch.profiler.profile).parameters) - set(parameters) == set()


def test_profile_registers_with_dynamo_only_once_the_program_imports_it() -> None:
    """Nothing of torch is imported for it; a profile module loaded before torch still compiles
    as torch's once the program imports Dynamo."""
    code = (
        "import sys\n"
        "import stepscope\n"
        "stepscope.profile(torch_ops=False)\n"
        "print('torch' in sys.modules)\n"
        "import torch, torch._dynamo\n"
        "from torch._dynamo.utils import counters\n"
        "def body(x):\n"
        "    with stepscope.profile():\n"
        "        y = x.cos() + 1\n"
        "    return y * 2\n"
        "x = torch.randn(4)\n"
        "torch.testing.assert_close(torch.compile(body, backend='eager')(x), (x.cos() + 1) * 2)\n"
        "print(counters['frames']['total'], sum(counters['graph_break'].values()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.split() == ["False", "1", "0"], done.stderr[-2000:]
