"""A program whose window is still being saved when it ends (tests/test_window_save.py).

Usage: python tests/window_save_job.py OUT_DIR HOW

It records one window of a loop that runs a few thousand torch ops a step (its save takes a
while), then, right after the step that ended the window: ``exit`` (``sys.exit(3)``, the profile
never stopped), ``raise`` (an uncaught exception, the profile never stopped), ``with_raise`` (an
exception out of ``with stepscope.profile(...)``), ``sigterm`` (SIGTERM to itself, the default
action) or ``own_sigterm`` (SIGTERM to itself with the program's own handler, which exits 7).
It prints ``ended <HOW>`` on stdout before it ends.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

import stepscope


def main() -> None:
    """Run the loop; end it the way ``sys.argv[2]`` says."""
    out, how = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(200)])
    x = torch.randn(4, 8)
    if how == "own_sigterm":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
    schedule = stepscope.schedule(wait=0, warmup=0, active=3, repeat=1)
    prof = stepscope.profile(schedule=schedule, on_trace_ready=stepscope.trace_handler(out))
    if how == "with_raise":
        with prof:
            for _ in range(3):
                model(x).sum().backward()
                prof.step()
            _end(how)
    prof.start()
    for _ in range(3):
        model(x).sum().backward()
        prof.step()
    _end(how)


def _end(how: str) -> None:
    print(f"ended {how}", flush=True)
    if how == "exit":
        sys.exit(3)
    if how in ("raise", "with_raise"):
        raise RuntimeError("the program failed right after its window")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)  # the signal arrives before this ends


if __name__ == "__main__":
    main()
