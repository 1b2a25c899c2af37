"""Two ranks whose schedules differ (rank 1's window is one step longer), under torchrun.

argv: OUT_DIR.  Each rank writes ``waited_rank<N>.txt``: the seconds its window-ending
``step()`` took (the clock handshake runs there).
"""

from __future__ import annotations

import os
import sys
import time

import torch.distributed as dist

import stepscope


def main() -> None:
    """Profile six steps; rank 1's window ends one step after rank 0's."""
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    prof = stepscope.profile(
        schedule=stepscope.schedule(wait=1, warmup=1, active=2 + rank, repeat=1),
        on_trace_ready=stepscope.trace_handler(out),
        torch_ops=False,
    )
    waited = 0.0
    with prof:
        # both ranks' profiles start at the same boundary: with no collective between steps a
        # rank that joins later takes the leader's current step number, which may be ahead of
        # its own (rank 0 joining 0.5 s late took step 5, its window never came, and rank 1
        # waited out the whole timeout for it)
        dist.barrier()
        for _ in range(6):
            with stepscope.record_function("work"):
                time.sleep(0.002)
            before = time.monotonic()
            prof.step()
            waited = max(waited, time.monotonic() - before)
    with open(os.path.join(out, f"waited_rank{rank}.txt"), "w") as fh:
        fh.write(f"{waited}\n")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # as ranks_job.py: skip the interpreter's teardown


if __name__ == "__main__":
    main()
