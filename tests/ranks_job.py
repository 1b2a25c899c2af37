"""A tiny DDP training loop (gloo, CPU) under stepscope, launched by torchrun in the rank tests.

argv: OUT_DIR SLOW_RANK SLOW_MS [SKIP_RANK [LATE_RANK [HOW]]]: SLOW_RANK sleeps SLOW_MS in every
step inside ``get_batch`` (a slow input pipeline), or with HOW ``spin`` keeps the CPU busy for
SLOW_MS after the forward pass, outside any annotation (uninstrumented work), and writes the
time from the forward pass's end to the backward's start of each step, by its own clock, one line
per step to ``OUT_DIR/spin_rank<SLOW_RANK>.txt``; SKIP_RANK never
profiles at all; LATE_RANK starts its profile two training steps after the others (-1: none).
"""

from __future__ import annotations

import os
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
    late_rank = int(sys.argv[5]) if len(sys.argv) > 5 else -1
    spin = len(sys.argv) > 6 and sys.argv[6] == "spin"
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
    profiling = rank not in (skip_rank, late_rank)
    gaps: list[float] = []
    if profiling:
        prof.start()
    for i in range(STEPS):
        if rank == late_rank and i == 2:
            prof.start()  # its own count starts at 0: it must take the others' step 2
            profiling = True
        with stepscope.record_function("get_batch"):
            x = torch.randn(16, 32)
            if rank == slow_rank and not spin:
                time.sleep(slow_ms / 1000)
        loss = model(x).sum()
        if rank == slow_rank and spin:
            began = time.perf_counter()
            while time.perf_counter() < began + slow_ms / 1000:
                pass
            gaps.append(time.perf_counter() - began)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if profiling:
            prof.step()
    if profiling:
        prof.stop()
    if gaps:
        with open(os.path.join(out, f"spin_rank{rank}.txt"), "w") as fh:
            fh.write("".join(f"{g}\n" for g in gaps))
    dist.barrier()
    dist.destroy_process_group()
    # Skip the interpreter's teardown: about 1 run in 10 on this 2-core machine, a 4-rank job
    # aborted there ("terminate called without an active exception", SIGABRT) after its work
    # and its traces were done — a C++ thread of torch's left joinable at exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
