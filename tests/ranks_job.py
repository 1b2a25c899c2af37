"""A tiny DDP training loop (gloo, CPU) under stepscope, launched by torchrun in the rank tests.

argv: OUT_DIR SLOW_RANK SLOW_MS [SKIP_RANK]: SLOW_RANK sleeps SLOW_MS in every step inside
``get_batch`` (a slow input pipeline); SKIP_RANK (optional) never profiles at all.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

import stepscope

STEPS = 6


def main() -> None:
    """Train a few steps, one window of steps 2-4 on every profiling rank."""
    out, slow_rank, slow_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    skip_rank = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    prof = stepscope.profile(
        activities=[stepscope.ProfilerActivity.CPU],
        record_shapes=True,
        schedule=stepscope.schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=stepscope.trace_handler(out),
    )
    profiling = rank != skip_rank
    if profiling:
        prof.start()
    for _ in range(STEPS):
        with stepscope.record_function("get_batch"):
            x = torch.randn(16, 32)
            if rank == slow_rank:
                time.sleep(slow_ms / 1000)
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if profiling:
            prof.step()
    if profiling:
        prof.stop()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
