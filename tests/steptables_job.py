"""A tiny DDP loop (gloo, CPU) writing step tables, launched by torchrun in test_step_tables.

argv: TABLES_DIR SLOW_RANK SLOW_MS MEASURED_JSON: SLOW_RANK's dataset sleeps SLOW_MS in every
batch (a slow input pipeline); each rank writes the sleeps it measured itself, per step, to
MEASURED_JSON with its rank appended (the test's independent measurement).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import stepscope
from stepscope.steptables import StepTables

STEPS = 12
ROWS_PER_FILE = 5


class Batches(Dataset[torch.Tensor]):
    """STEPS batches; on the slow rank each one takes ``slow_ms`` longer, measured."""

    def __init__(self, slow_ms: float) -> None:
        self.slow_ms = slow_ms
        self.slept_ns: list[int] = []

    def __len__(self) -> int:
        return STEPS

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.slow_ms:
            start = time.perf_counter_ns()
            time.sleep(self.slow_ms / 1000)
            self.slept_ns.append(time.perf_counter_ns() - start)
        else:
            self.slept_ns.append(0)
        return torch.randn(16, 32)


def main() -> None:
    """Train STEPS steps with step tables on every rank."""
    tables, slow_rank, measured = sys.argv[1], int(sys.argv[2]), sys.argv[4]
    slow_ms = float(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Batches(slow_ms if rank == slow_rank else 0.0)
    loader = DataLoader(data, batch_size=None)
    prof = stepscope.profile(
        activities=[stepscope.ProfilerActivity.CPU],
        schedule=stepscope.schedule(wait=1, warmup=1, active=2, repeat=1),
        step_tables=StepTables(tables, rows_per_file=ROWS_PER_FILE, run="job"),
    )
    with prof:
        for x in loader:
            loss = model(x).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    with open(f"{measured}.{rank}", "w") as fh:
        json.dump(data.slept_ns, fh)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as tests/ranks_job.py: skip a teardown that sometimes aborts on 2 cores


if __name__ == "__main__":
    main()
