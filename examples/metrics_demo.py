"""Per-step metrics of a training loop, served to Prometheus.

    python examples/metrics_demo.py                 # 30 steps, prints what a scrape returns
    python examples/metrics_demo.py --serve 60      # keep serving for a minute
    python examples/metrics_demo.py --port 0        # any free port

Point a Prometheus ``scrape_config`` at ``127.0.0.1:9464`` (the default port).  With torch
installed the loop trains a tiny linear model and records the loss tensor as it is (no
``.item()`` on the hot path: the export thread reads it); without torch it fakes the work.
"""

from __future__ import annotations

import argparse
import random
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from stepscope import metrics
from stepscope.clock import now_ns
from stepscope.steps import set_step


def make_step(use_torch: bool) -> tuple[Callable[[], Any], int]:
    """A function doing one training step and returning its loss, and the batch size."""
    batch = 64
    if use_torch:
        try:
            import torch
        except ImportError:
            use_torch = False
    if not use_torch:
        state = {"loss": 4.0}

        def fake_step() -> float:
            state["loss"] *= 0.93
            time.sleep(0.002)
            return state["loss"] + random.random() * 0.05

        return fake_step, batch

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    true_w = torch.randn(16, 1)

    def torch_step() -> Any:
        x = torch.randn(batch, 16)
        loss = torch.nn.functional.mse_loss(model(x), x @ true_w)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss  # a tensor: recorded without synchronising

    return torch_step, batch


def main() -> None:
    """Run the loop, export to Prometheus, print the scrape."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9464)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--serve", type=float, default=0.0, help="seconds to keep serving")
    parser.add_argument("--no-torch", action="store_true", help="fake the work without torch")
    args = parser.parse_args()

    # The two lines a training loop needs: an exporter, and a value per step.
    endpoint = metrics.add_exporter(metrics.PrometheusEndpoint(port=args.port))
    loss_metric = metrics.scalar("train.loss")  # mean of the step's values

    samples = metrics.counter("train.samples", "samples seen")
    step_seconds = metrics.histogram(
        "train.step_seconds", "wall time per step", buckets=[0.001, 0.003, 0.01, 0.03, 0.1, 1]
    )
    run_step, batch = make_step(use_torch=not args.no_torch)
    for step in range(args.steps):
        set_step(step)  # the profiler does this when it drives the loop
        start = now_ns()
        loss_metric.record(run_step())
        samples.inc(batch)
        step_seconds.observe((now_ns() - start) / 1e9)
    set_step(args.steps)
    metrics.flush()

    with urllib.request.urlopen(endpoint.url, timeout=10) as reply:
        text = reply.read().decode()
    print(f"# scraped {endpoint.url}")
    for line in text.splitlines():
        if line.startswith(("train_", "stepscope_step")):
            print(line)
    if args.serve > 0:
        print(f"# serving for {args.serve:g} s ...", flush=True)
        time.sleep(args.serve)
    metrics.shutdown()


if __name__ == "__main__":
    main()
