"""A tiny DDP loop (gloo, CPU) made attachable with ``stepscope.listen()``, for the attach tests.

argv: STOP_FILE.  Every rank steps (~10 ms each) until rank 0 sees STOP_FILE; the ranks agree
on the last step with a broadcast, so they all stop together.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import stepscope

MAX_STEPS = 20_000


def main() -> None:
    """Train until told to stop."""
    stop_file = sys.argv[1]
    dist.init_process_group("gloo")
    session = stepscope.listen()  # after init: the ranks agree on step numbers
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stop = torch.zeros(1)
    for _ in range(MAX_STEPS):
        if dist.get_rank() == 0 and os.path.exists(stop_file):
            stop.fill_(1)
        dist.broadcast(stop, 0)
        if stop.item():
            break
        time.sleep(0.01)
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    session.stop()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as tests/ranks_job.py: skip torch's teardown, which can abort on 2 cores


if __name__ == "__main__":
    main()
