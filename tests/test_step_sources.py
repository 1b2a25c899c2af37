"""Every collector under every step source: windows open and close inside torch's optimizer hook
loop (steps from the optimizer) and the training loop runs to its end (issue 23, point 1)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stepscope  # noqa: E402
from stepscope.collectors import optimizer_hook  # noqa: E402
from stepscope.collectors.base import Collector, WindowContext  # noqa: E402
from stepscope.failures import failure_counts  # noqa: E402
from stepscope.trace.names import OWN_WORK_FRAME  # noqa: E402

pytestmark = pytest.mark.slow

ExperimentalConfig = torch._C._profiler._ExperimentalConfig
STEPS = 12
COLLECTORS: dict[str, dict[str, Any]] = {
    "default": {},
    "with_stack": {"with_stack": True},
    "sampling": {"activities": ["CPU", "SAMPLING"], "sampling_rate_hz": 500.0},
    "memory": {"profile_memory": True},
    "gc": {"experimental_config": ExperimentalConfig(record_python_gc_info=True)},
    "all": {
        "activities": ["CPU", "SAMPLING"],
        "with_stack": True,
        "profile_memory": True,
        "record_shapes": True,
        "experimental_config": ExperimentalConfig(record_python_gc_info=True),
    },
}
SOURCES = ("optimizer", "function", "manual", "user_hook")

_model: Any = None
_optimizer: Any = None


def train_step() -> None:
    """One step of the tiny loop (the ``function`` step source wraps it)."""
    loss = _model(torch.randn(4, 8)).square().sum()
    loss.backward()
    _optimizer.step()
    _optimizer.zero_grad()


def _global_post_hooks() -> list[Any]:
    from torch.optim import optimizer as torch_optimizer

    return list(torch_optimizer._global_optimizer_post_hooks.values())


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("collectors", sorted(COLLECTORS))
def test_every_collector_under_every_step_source_runs_to_the_end(
    source: str, collectors: str
) -> None:
    global _model, _optimizer
    _model = torch.nn.Linear(8, 8)
    _optimizer = torch.optim.SGD(_model.parameters(), lr=0.01)
    step_on = {"optimizer": "optimizer", "function": f"{__name__}:train_step"}.get(source)
    prof = stepscope.profile(
        schedule=stepscope.schedule(wait=1, warmup=1, active=2, repeat=2),
        step_on=step_on,
        acc_events=True,
        strict=True,  # a failure of stepscope's own would fail the test, not hide in a log
        **COLLECTORS[collectors],
    )
    user_hook = None
    with prof:
        if source == "user_hook":  # the program ends steps from its own optimizer hook
            user_hook = _optimizer.register_step_post_hook(lambda *_: prof.step())
        step: Callable[[], None] = globals()["train_step"]  # wrapped in place by "function"
        for _ in range(STEPS):
            step()
            if source == "manual":
                prof.step()
    if user_hook is not None:
        user_hook.remove()
    assert prof.step_num == STEPS
    assert len(prof.traces) == 2, "both windows recorded"
    for trace in prof.traces:
        names = set(trace.strings)
        assert {n for n in names if n.startswith("ProfilerStep#")}, "steps recorded"
        assert any(n.startswith("Optimizer.step#SGD") for n in names)
    if collectors in ("memory", "all"):
        recorded = [
            [row["step"] for row in t.metadata["stepscope_memory"]["steps"]] for t in prof.traces
        ]
        assert recorded == [[2, 3], [6, 7]]
    assert optimizer_hook.listening() == 0, "every listener left with its profile"
    hooks = _global_post_hooks()
    assert hooks.count(optimizer_hook._dispatch) <= 1, "one hook per process, never re-added"


def test_a_failing_listener_is_counted_and_the_optimizer_step_goes_on() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[Any] = []

    def broken(optimizer: Any) -> None:
        raise ValueError("boom")

    before = failure_counts().get("collectors", {}).get("optimizer_hook_error", 0)
    optimizer_hook.add_listener(broken, strict=False)
    optimizer_hook.add_listener(seen.append, strict=False)
    try:
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
    finally:
        optimizer_hook.remove_listener(broken)
        optimizer_hook.remove_listener(seen.append)
    assert seen == [opt], "the next listener still ran"
    after = failure_counts()["collectors"]["optimizer_hook_error"]
    assert after == before + 1


class _SlowStepEnd(Collector):
    """A collector whose step-end work takes a known time (stepscope's own work)."""

    name = "slow_step_end"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step(self, ctx: WindowContext, step: int) -> None:
        """Busy for ``seconds``."""
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass


def test_step_end_work_in_the_optimizer_hook_is_not_the_optimizers_time() -> None:
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    own = 0.05
    prof = stepscope.profile(
        schedule=stepscope.schedule(wait=0, warmup=1, active=3, repeat=1),
        step_on="optimizer",
        collectors=[_SlowStepEnd(own)],
    )
    with prof:
        for _ in range(5):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    rows = {row.key: row for row in prof.key_averages()}
    own_row = rows[OWN_WORK_FRAME]
    assert own_row.count == 2, "between steps 1-2 and 2-3 (the window's inner step ends)"
    assert own_row.cpu_time_total >= 0.9 * 2 * own * 1e6  # µs, what the collector spent
    optimizer = rows["Optimizer.step#SGD.step"]
    # 2 x 50 ms of stepscope's work ran inside these optimizer steps' hook: none of it is theirs
    assert optimizer.self_cpu_time_total < 0.5 * 2 * own * 1e6, optimizer.self_cpu_time_total
