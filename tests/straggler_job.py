"""A synchronous DDP loop (gloo, CPU) writing step tables, with one rank slowed from a step on:
the fault injection of tests/test_collective_wait.py, launched by torchrun.

argv: TABLES_DIR FAULT SLOW_RANK FROM_STEP SLOW_MS STEPS: from step FROM_STEP on, rank SLOW_RANK
spends about SLOW_MS more per step in one phase, by FAULT:

- ``data``: its dataset sleeps in ``__getitem__`` (a slow input pipeline);
- ``compute``: its model's forward runs extra matrix products (extra compute);
- ``gc``: it collects a large heap of tracked objects before the forward pass (a GC storm);
- ``sleep``: it sleeps before the forward pass (the program's own host Python);
- ``none``: nothing (an unslowed job).

Each rank writes the time it measured in the injected work per step, by its own clock, to
``TABLES_DIR/../injected-<rank>.json`` (the test's independent measurement).  With
``STRAGGLER_JOB_TRACES=DIR`` the profile also writes one trace window (steps FROM_STEP + 5 to
+ 7) into DIR; with ``STRAGGLER_JOB_RUN`` set, the loop runs without a profile of its own (under
``stepscope run --step-tables``).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import stepscope
from stepscope.steptables import StepTables

BATCH = 32
WIDTH = 128


class State:
    """What the fault needs: the step, whether this rank is slowed, and what it measured."""

    def __init__(self, fault: str, slowed: bool, from_step: int, slow_ms: float) -> None:
        self.fault, self.slowed, self.from_step, self.slow_s = (
            fault,
            slowed,
            from_step,
            slow_ms / 1e3,
        )
        self.step = 0
        self.injected: list[int] = []
        self.heap: list[object] = []

    def active(self, fault: str) -> bool:
        return self.slowed and self.fault == fault and self.step >= self.from_step

    def inject(self, fault: str) -> None:
        """Run the fault's work for about ``slow_ms`` when it is this one's, timed."""
        if not self.active(fault):
            return
        began = time.perf_counter_ns()
        deadline = time.perf_counter() + self.slow_s
        if fault in ("data", "sleep"):
            time.sleep(self.slow_s)
        elif fault == "compute":
            a = torch.randn(256, 256)
            while time.perf_counter() < deadline:
                a = torch.tanh(a @ a)
        elif fault == "gc":
            if not self.heap:  # the program's objects so far: frozen, scanned by no collection
                gc.freeze()
                self.heap = [[] for _ in range(150_000)]
            gc.collect()
            while time.perf_counter() < deadline:
                gc.collect()
        self.injected[-1] += time.perf_counter_ns() - began


class Batches(Dataset[torch.Tensor]):
    """``steps`` batches; the ``data`` fault sleeps in ``__getitem__``."""

    def __init__(self, steps: int, state: State) -> None:
        self.steps, self.state = steps, state

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, index: int) -> torch.Tensor:
        self.state.inject("data")
        return torch.randn(BATCH, WIDTH)


class Model(torch.nn.Module):
    """Two layers; the ``compute`` fault adds matrix products inside the forward pass."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.one = torch.nn.Linear(WIDTH, WIDTH)
        self.two = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.inject("compute")
        out: torch.Tensor = self.two(torch.relu(self.one(x)))
        return out


def main() -> None:
    """Train STEPS steps, step tables on every rank."""
    tables, fault, slow_rank = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    from_step, slow_ms, steps = int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
    torch.set_num_threads(1)  # every rank shares the same few cores
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    state = State(fault, rank == slow_rank, from_step, slow_ms)
    model = torch.nn.parallel.DistributedDataParallel(Model(state))
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    loader = DataLoader(Batches(steps, state), batch_size=None)
    own = not os.environ.get("STRAGGLER_JOB_RUN")
    traces = os.environ.get("STRAGGLER_JOB_TRACES")
    if traces:  # also one trace window of 3 steps, 5 steps after the fault began
        window = stepscope.schedule(wait=from_step + 4, warmup=1, active=3, repeat=1)
        prof = stepscope.profile(
            activities=[stepscope.ProfilerActivity.CPU],
            schedule=window,
            on_trace_ready=stepscope.trace_handler(traces),
            step_tables=StepTables(tables, run="job"),
        )
    else:
        prof = stepscope.profile(
            schedule=lambda step: stepscope.ProfilerAction.NONE,
            step_tables=StepTables(tables, run="job"),
            torch_ops=False,
        )
    if own:
        prof.start()
    batches = iter(loader)
    for step in range(steps):
        state.step = step
        state.injected.append(0)
        x = next(batches)
        state.inject("sleep")
        state.inject("gc")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if own:
            prof.step()
    if own:
        prof.stop()
    (tables.parent / f"injected-{rank}.json").write_text(json.dumps(state.injected))
    dist.barrier()
    dist.destroy_process_group()
    if not own:
        return  # stepscope run stops its profile (and writes the tables) when the program ends
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as tests/ranks_job.py: skip a teardown that sometimes aborts on 2 cores


if __name__ == "__main__":
    main()
