"""A long-running loop for the attach tests: ``plain`` (Python only) or ``torch`` (optimizer steps).

argv: MODE STOP_FILE TIMES_FILE.  MODE ``listen`` is ``plain`` with ``import stepscope`` once
``train_step`` is defined (for ``STEPSCOPE_LISTEN=1``, ``STEPSCOPE_STEP_ON=__main__:train_step``);
``listen_call`` is ``plain`` that calls ``stepscope.listen(step_on="__main__:train_step")``.
Each step is one call of ``train_step`` (plain) or one
optimizer step (torch), ~5 ms; the loop runs until STOP_FILE exists, then writes every step's
(start, end) ``time.time_ns()`` to TIMES_FILE and prints a line the test recomputes.
"""

from __future__ import annotations

import json
import os
import sys
import time

MAX_STEPS = 20_000


def work(i: int) -> int:
    """Some Python work whose result depends only on ``i``."""
    return sum(k * k for k in range(2000)) + i


def train_step(i: int) -> int:
    """One plain-Python step (blocked in C for 3.5 s once the file ATTACH_TARGET_BLOCK names is
    there: it is removed first)."""
    block = os.environ.get("ATTACH_TARGET_BLOCK")
    if block and os.path.exists(block):
        os.remove(block)
        time.sleep(3.5)
    time.sleep(0.005)
    return work(i)


def main() -> None:
    """Step until the stop file appears."""
    mode, stop_file, times_file = sys.argv[1], sys.argv[2], sys.argv[3]
    times: list[tuple[int, int]] = []
    total = 0
    if mode == "listen":
        import stepscope  # noqa: F401  (STEPSCOPE_LISTEN=1: listens from here on)
    elif mode == "listen_call":
        from stepscope import listen

        listen(step_on="__main__:train_step")
    if mode == "torch":
        import torch

        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = torch.ones(16, 8)
    for i in range(MAX_STEPS):
        if os.path.exists(stop_file):
            break
        start = time.time_ns()
        if mode == "torch":
            time.sleep(0.005)
            loss = model(data).sum()
            loss.backward()
            opt.step()  # the step boundary
            opt.zero_grad()
            total += work(i)
        else:
            total += train_step(i)  # the step boundary: train_step returns
        times.append((start, time.time_ns()))
    with open(times_file, "w") as f:
        json.dump(times, f)
    print(f"{len(times)} steps, total {total}")


if __name__ == "__main__":
    main()
