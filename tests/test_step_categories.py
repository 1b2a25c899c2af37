"""Step categories come from what ran inside the step, whatever span crosses its edge; work a
closure runs inside ``Optimizer.step`` is forward and backward (issue 23, point 2)."""

from __future__ import annotations

from stepscope.analysis.analyze import analyze_trace
from stepscope.analysis.diff import diff_summaries
from stepscope.trace.model import Trace, TraceBuilder
from stepscope.trace.nesting import nest_spans
from stepscope.trace.stacks import span_stacks_ns

OPT = "Optimizer.step#SGD.step"
BACKWARD = "autograd::engine::evaluate_function: AddmmBackward0"


def _steps_closed_from_the_optimizer_hook(steps: int = 3, forward: int = 300) -> Trace:
    """Steps of 1000 ns; each step's Optimizer.step (800..1050) outlives it by 50 ns, as when
    the step is closed from torch's optimizer post-hook."""
    b = TraceBuilder(base_time_ns=0)
    for n in range(steps):
        at = 1000 * n
        b.span(f"ProfilerStep#{n}", "user_annotation", 1, 1, at, 1000)
        b.span("aten::linear", "cpu_op", 1, 1, at + 100, forward)  # forward: 300
        b.span(BACKWARD, "cpu_op", 1, 1, at + 150 + forward, 250)  # backward: 250
        b.span(OPT, "user_annotation", 1, 1, at + 800, 250)  # optimizer: 200 in this step
        b.span("aten::add_", "cpu_op", 1, 1, at + 820, 100)
    return b.build()


def _shares(trace: Trace) -> dict[int | None, dict[str, int]]:
    summary = analyze_trace(trace)
    return {s.step: {c.name: c.ns for c in s.categories} for s in summary.host_steps}


def test_a_step_opened_inside_the_previous_optimizer_step_keeps_its_own_categories() -> None:
    shares = _shares(_steps_closed_from_the_optimizer_hook())
    for step in (1, 2):  # step 0 is not inside an optimizer step; the later ones are
        got = shares[step]
        # forward: the operator and the Python after it up to backward (100..450)
        assert (got["forward"], got["backward"], got["optimizer"]) == (350, 250, 200), got
        assert got["idle_other"] == 1000 - 800, "the step's own time, with the tail it crossed"


def test_steps_do_not_stack_under_the_optimizer_step_they_cross() -> None:
    trace = _steps_closed_from_the_optimizer_hook()
    nesting = nest_spans(trace)
    names = [trace.strings[n] for n in trace.spans["name"]]
    for i, name in enumerate(names):
        if name.startswith("ProfilerStep#"):
            assert nesting.parent[i] == -1, f"{name} hangs under {names[nesting.parent[i]]}"
    for stack in span_stacks_ns(trace):
        assert stack.count("ProfilerStep") == 1, stack  # no staircase in the flame graph


def test_a_closure_inside_optimizer_step_is_forward_and_backward() -> None:
    b = TraceBuilder(base_time_ns=0)
    b.span("ProfilerStep#1", "user_annotation", 1, 1, 0, 1000)
    b.span(OPT, "user_annotation", 1, 1, 100, 900)  # optimizer.step(closure), 100..1000
    b.span("aten::linear", "cpu_op", 1, 1, 150, 100)  # the closure's forward
    b.span("Optimizer.zero_grad#SGD.zero_grad", "user_annotation", 1, 1, 260, 20)
    b.span(BACKWARD, "cpu_op", 1, 1, 300, 200)  # the closure's backward, ends at 500
    b.span("aten::add_", "cpu_op", 1, 1, 600, 50)  # the update
    got = _shares(b.build())[1]
    # the forward pass runs from the operator to backward (150..300) less zero_grad
    assert got["forward"] == 100 + 10 + 20
    assert got["backward"] == 200
    assert got["optimizer"] == 20 + 500, "zero_grad, and everything after the closure"
    # the step's own 100 ns, and the closure's own Python outside the forward pass
    # (100..150, and 500..500: nothing after backward before the closure ends)
    assert got["idle_other"] == 100 + 50
    assert sum(got.values()) == 1000


def test_diff_sees_a_slower_forward_pass_as_forward() -> None:
    a = analyze_trace(_steps_closed_from_the_optimizer_hook(steps=5))
    b = analyze_trace(_steps_closed_from_the_optimizer_hook(steps=5, forward=340))
    rows = {row.name: row for row in diff_summaries(a, b).categories}
    assert rows["forward"].delta_ns == 40
    assert rows["optimizer"].delta_ns == 0


def test_a_closure_whose_backward_runs_on_the_autograd_thread_is_still_backward() -> None:
    b = TraceBuilder(base_time_ns=0)
    b.span("ProfilerStep#1", "user_annotation", 1, 1, 0, 1000)
    b.span(OPT, "user_annotation", 1, 1, 100, 900)
    b.span("aten::linear", "cpu_op", 1, 1, 150, 100)  # forward, on the step's thread
    b.span(BACKWARD, "cpu_op", 1, 2, 300, 200)  # the engine's device thread (a GPU run)
    b.span("aten::add_", "cpu_op", 1, 1, 600, 50)
    got = _shares(b.build())[1]
    assert got["forward"] == 100 + 50, "the operator and the Python after it up to backward"
    assert got["backward"] == 200, "the step's thread waited for it inside the closure"
    assert got["optimizer"] == 500
    assert got["idle_other"] == 100 + 50


def test_a_region_holding_the_backward_pass_says_nothing_about_what_runs_in_it() -> None:
    # a user's record_function("train_step") around forward and backward (Lightning's
    # ``run_training_batch`` region is one): its operators are forward and backward all the
    # same, and its own Python in the forward pass is forward
    b = TraceBuilder(base_time_ns=0)
    b.span("ProfilerStep#1", "user_annotation", 1, 1, 0, 1000)
    b.span("train_step", "user_annotation", 1, 1, 50, 800)
    b.span("aten::linear", "cpu_op", 1, 1, 100, 200)  # forward pass 100..400
    b.span(BACKWARD, "cpu_op", 1, 1, 400, 300)
    b.span("compute_metrics", "user_annotation", 1, 1, 720, 100)  # a region of its own
    got = _shares(b.build())[1]
    assert got["forward"] == 300, got
    assert got["backward"] == 300
    assert got["other_annotated"] == 100
    assert got["idle_other"] == 1000 - 700, "before the pass, and after the backward"


def test_the_autograd_engines_time_between_backward_spans_is_backward() -> None:
    b = TraceBuilder(base_time_ns=0)
    b.span("ProfilerStep#1", "user_annotation", 1, 1, 0, 1000)
    b.span("aten::linear", "cpu_op", 1, 1, 100, 200)
    b.span(BACKWARD, "cpu_op", 1, 1, 350, 100)
    b.span(BACKWARD, "cpu_op", 1, 1, 470, 100)  # 20 ns of engine time between the two
    b.span("aten::linear", "cpu_op", 1, 1, 600, 100)  # a second micro-batch's forward
    b.span(BACKWARD, "cpu_op", 1, 1, 750, 100)
    got = _shares(b.build())[1]
    assert got["backward"] == 100 + 20 + 100 + 100
    assert got["forward"] == (350 - 100) + (750 - 600)
    assert got["idle_other"] == 100 + (600 - 570) + (1000 - 850)


def test_a_collective_that_outlives_its_step_stays_communication() -> None:
    # gloo's ``gloo:all_reduce`` runs on its own thread and may end after the next step's
    # backward began: it holds a backward span then, and is still no step-wide region
    b = TraceBuilder(base_time_ns=0)
    b.span("ProfilerStep#1", "user_annotation", 1, 1, 0, 1000)
    b.span("aten::linear", "cpu_op", 1, 1, 50, 100)
    b.span(BACKWARD, "cpu_op", 1, 1, 200, 100)
    b.span("gloo:all_reduce", "user_annotation", 1, 2, 350, 900)  # waited on until 1000
    b.span("ProfilerStep#2", "user_annotation", 1, 1, 1000, 1000)
    b.span("aten::linear", "cpu_op", 1, 1, 1050, 100)
    b.span(BACKWARD, "cpu_op", 1, 1, 1200, 100)  # begins inside the collective
    got = _shares(b.build())[1]
    assert got["communication"] == 1000 - 350, got
