# mypy: disable-error-code="no-untyped-call"
"""Programs the flight recorder tests run, one per ``argv[1]``.

argv: MODE OUT [ARGS...].  Each prints what a user's program prints (its step count, its
result), so a test can compare its output and exit status with and without the recorder.

- ``slow OUT STEPS SLOW_AT [flight N]``: a loop of ~2 ms steps (a ``record_function`` each);
  step SLOW_AT sleeps 0.3 s.  With ``flight N`` it runs inside ``profile(flight_recorder=N)``.
- ``raise OUT STEPS RAISE_AT [flight N]``: the same loop; step RAISE_AT raises ``ValueError``.
- ``torch OUT STEPS RAISE_AT``: a torch loop whose steps end at the optimizer (for
  ``stepscope run``); step RAISE_AT raises ``ValueError`` before its optimizer step.
- ``hang OUT STEPS HANG_AT``: one rank of a 2-rank gloo job (RANK, WORLD_SIZE, MASTER_ADDR,
  MASTER_PORT from the environment) that all-reduces every step; rank 1 sleeps for ever before
  the all-reduce of step HANG_AT, so rank 0 waits in it for ever (the hang case).
- ``trivial OUT STEPS``: ``STEPS`` steps of one empty ``record_function`` each under
  ``profile(flight_recorder=100)`` (no step is slow enough to dump: the ring alone); prints the
  RSS (bytes) after each tenth of them.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

import stepscope
from stepscope.rss import rss_bytes


def _spin(seconds: float) -> int:
    end, total = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        total += 1
    return total


def _profile(argv: list[str], out: str, **options: Any) -> Any:
    if len(argv) > 1 and argv[0] == "flight":
        # every slow step dumps (min_steps_between=1): a stall of the host never hides the bad one
        recorder = stepscope.FlightRecorder(
            steps=int(argv[1]), out=out, slow_min_s=0.15, min_steps_between=1, **options
        )
        return stepscope.profile(flight_recorder=recorder)
    return contextlib.nullcontext()


def loop(mode: str, out: str, steps: int, bad: int, rest: list[str]) -> None:
    with _profile(rest, out, hang_s=0) as prof:
        for step in range(steps):
            with stepscope.record_function("forward"):
                _spin(0.002)
            if step == bad and mode == "slow":
                time.sleep(0.3)
            if step == bad and mode == "raise":
                raise ValueError(f"bad batch at step {step}")
            if prof is not None:
                prof.step()
    print(f"done {steps} steps")


def torch_loop(steps: int, bad: int) -> None:
    """A torch training loop (steps end at the optimizer, under ``stepscope run``)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        loss = model(torch.randn(32, 16)).pow(2).mean()
        loss.backward()
        if step == bad:
            raise ValueError(f"bad batch at step {step}")
        opt.step()
        opt.zero_grad()
    print(f"done {steps} steps")


def hang(out: str, steps: int, bad: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    recorder = stepscope.FlightRecorder(steps=5, out=out, hang_s=1.5)
    with stepscope.profile(flight_recorder=recorder) as prof:
        for step in range(steps):
            with stepscope.record_function("forward"):
                _spin(0.002)
            if step == bad and rank == 1:
                print("rank 1 stops before the all-reduce", flush=True)
                time.sleep(3600)
            with stepscope.record_function("all_reduce"):
                dist.all_reduce(torch.ones(4))
            prof.step()


def trivial(out: str, steps: int) -> None:
    recorder = stepscope.FlightRecorder(steps=100, out=out, hang_s=0, slow_min_s=1.0)
    tenth = steps // 10
    with stepscope.profile(flight_recorder=recorder) as prof:
        for step in range(steps):
            with stepscope.record_function("step"):
                pass
            prof.step()
            if step % tenth == tenth - 1:
                print(rss_bytes(), flush=True)


def main(argv: list[str]) -> None:
    mode, out = argv[1], argv[2]
    steps = int(argv[3])
    if mode in ("slow", "raise"):
        loop(mode, out, steps, int(argv[4]), argv[5:])
    elif mode == "torch":
        torch_loop(steps, int(argv[4]))
    elif mode == "hang":
        hang(out, steps, int(argv[4]))
    elif mode == "trivial":
        trivial(out, steps)
    else:
        raise SystemExit(f"no such mode: {mode}")


if __name__ == "__main__":
    main(sys.argv)
