"""Two ranks under torchrun, in a loop with no collective between steps.

argv: OUT_DIR [late].  By default rank 1's window is one step longer than rank 0's (the
schedules differ) and both profiles start at one boundary.  With ``late``, both ranks have the
same schedule, steps take 0.1 s, and rank 0 starts its profile 0.55 s after rank 1 (rank 1,
the step leader, is then at its step 5, past the window).  Each rank writes
``waited_rank<N>.txt``: the seconds its slowest ``step()`` took (the clock handshake runs there).
"""

from __future__ import annotations

import os
import sys
import time

import torch.distributed as dist

import stepscope


def main() -> None:
    """Profile six steps (eight with ``late``)."""
    out, late = sys.argv[1], sys.argv[2:] == ["late"]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    prof = stepscope.profile(
        schedule=stepscope.schedule(wait=1, warmup=1, active=2 + (0 if late else rank), repeat=1),
        on_trace_ready=stepscope.trace_handler(out),
        torch_ops=False,
    )
    dist.barrier()
    if late and rank == 0:
        time.sleep(0.55)
    waited = 0.0
    with prof:
        if not late:
            dist.barrier()  # both profiles start at the same boundary
        for _ in range(8 if late else 6):
            with stepscope.record_function("work"):
                time.sleep(0.1 if late else 0.002)
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
