"""A plain-Python training-style loop profiled with a schedule (no torch needed).

Run it with ``make demo`` (or ``python examples/train_loop.py [OUT_DIR]``).  It fits a small
linear model with mini-batch SGD, profiles two windows of three steps each, prints the
key_averages table, and writes Chrome traces (open them in https://ui.perfetto.dev) and
collapsed stacks (for flamegraph.pl or speedscope) under OUT_DIR (default ``out/demo``).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

import stepscope

FEATURES = 32
BATCH = 64


def batches(seed: int = 0) -> Iterator[tuple[list[list[float]], list[float]]]:
    """Endless mini-batches of a noisy linear problem."""
    rng = random.Random(seed)
    true_w = [rng.uniform(-1, 1) for _ in range(FEATURES)]
    while True:
        with stepscope.record_function("data.make_batch"):
            xs = [[rng.gauss(0, 1) for _ in range(FEATURES)] for _ in range(BATCH)]
            ys = [
                sum(w * x for w, x in zip(true_w, row, strict=True)) + rng.gauss(0, 0.1)
                for row in xs
            ]
        yield xs, ys


@stepscope.traced
def forward(w: list[float], xs: list[list[float]]) -> list[float]:
    """Predictions of the linear model."""
    return [sum(wi * xi for wi, xi in zip(w, row, strict=True)) for row in xs]


@stepscope.traced
def loss_and_grad(
    preds: list[float], ys: list[float], xs: list[list[float]]
) -> tuple[float, list[float]]:
    """Mean squared error and its gradient."""
    errors = [p - y for p, y in zip(preds, ys, strict=True)]
    loss = sum(e * e for e in errors) / len(errors)
    grad = [0.0] * FEATURES
    for e, row in zip(errors, xs, strict=True):
        for j, x in enumerate(row):
            grad[j] += 2 * e * x / len(errors)
    return loss, grad


@stepscope.traced
def sgd_step(w: list[float], grad: list[float], lr: float) -> None:
    """In-place SGD update."""
    for j, g in enumerate(grad):
        w[j] -= lr * g


def main(out_dir: Path) -> None:
    """Train for 12 steps, profiling steps 2-4 and 7-9."""
    trace_dir = out_dir / "traces"
    w = [0.0] * FEATURES
    data = batches()
    loss = float("nan")
    with stepscope.profile(
        schedule=stepscope.schedule(wait=1, warmup=1, active=3, repeat=2),
        on_trace_ready=stepscope.trace_handler(trace_dir),
    ) as prof:
        for _ in range(12):
            xs, ys = next(data)
            with stepscope.record_function("forward"):
                preds = forward(w, xs)
            with stepscope.record_function("backward"):
                loss, grad = loss_and_grad(preds, ys, xs)
            with stepscope.record_function("optimizer"):
                sgd_step(w, grad, lr=0.05)
            prof.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    stacks = out_dir / "stacks.txt"
    prof.export_stacks(stacks)
    print(f"final loss: {loss:.4f}")
    print("trace files (open in https://ui.perfetto.dev or chrome://tracing):")
    for path in prof.trace_files:
        print(f"  {path}")
    print(f"collapsed stacks (flamegraph.pl / speedscope): {stacks}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("out/demo"))
