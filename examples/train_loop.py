"""A plain-Python training loop (no torch needed), profiled from outside by ``stepscope run``.

``make demo`` runs it as::

    stepscope run -o out/demo/traces --step-on train_loop:train_step examples/train_loop.py
    stepscope report out/demo/traces --html out/demo/report.html

It fits a small linear model with mini-batch SGD.  The code knows nothing of the profiler but
names its phases with ``stepscope.record_function`` (free when nothing records), so the
report can split each step into data loading, forward, backward and optimizer; one batch in
five comes from a slow "shard" so that some steps stand out.  ``python examples/train_loop.py
[STEPS]`` just trains.
"""

from __future__ import annotations

import random
import sys

import stepscope

FEATURES = 32
BATCH = 256
SLOW_EVERY = 5


def load_batch(
    rng: random.Random, true_w: list[float], slow: bool
) -> tuple[list[list[float]], list[float]]:
    """A mini-batch of a noisy linear problem (a slow shard makes and discards extra rows)."""
    with stepscope.record_function("data_loading"):
        rows = BATCH * (3 if slow else 1)
        xs = [[rng.gauss(0, 1) for _ in range(FEATURES)] for _ in range(rows)][:BATCH]
        ys = [
            sum(w * x for w, x in zip(true_w, row, strict=True)) + rng.gauss(0, 0.1) for row in xs
        ]
    return xs, ys


def forward(w: list[float], xs: list[list[float]]) -> list[float]:
    """Predictions of the linear model."""
    return [sum(wi * xi for wi, xi in zip(w, row, strict=True)) for row in xs]


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


def sgd_step(w: list[float], grad: list[float], lr: float) -> None:
    """In-place SGD update."""
    for j, g in enumerate(grad):
        w[j] -= lr * g


def train_step(
    w: list[float], batch: tuple[list[list[float]], list[float]], lr: float = 0.05
) -> float:
    """One step: forward, backward, optimizer (``--step-on train_loop:train_step``)."""
    xs, ys = batch
    with stepscope.record_function("forward"):
        preds = forward(w, xs)
    with stepscope.record_function("backward"):
        loss, grad = loss_and_grad(preds, ys, xs)
    with stepscope.record_function("optimizer.step"):
        sgd_step(w, grad, lr)
    return loss


def main(steps: int = 30) -> float:
    """Train for ``steps`` steps; returns the last loss."""
    rng = random.Random(0)
    true_w = [rng.uniform(-1, 1) for _ in range(FEATURES)]
    w = [0.0] * FEATURES
    loss = float("nan")
    for step in range(steps):
        batch = load_batch(rng, true_w, slow=step % SLOW_EVERY == SLOW_EVERY - 1)
        loss = train_step(w, batch)
    print(f"trained {steps} steps, final loss {loss:.4f}")
    return loss


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
