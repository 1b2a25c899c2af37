"""Datasets and loops for the DataLoader workers tests (importable by spawned workers).

Every item says which worker made it (``get_worker_info``), how much CPU its ``__getitem__``
took by its own ``time.thread_time_ns()``, and when it ran (``time.monotonic_ns()``: the same
system-wide clock stepscope's is calibrated to), so a test can check stepscope's numbers
against the dataset's own.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

ITEM_FIELDS = ("index", "worker", "cpu_ns", "start_ns", "end_ns", "init_marker")


def spin(n: int) -> int:
    """Pure-Python CPU work (the dataset function the samples should name)."""
    total = 0
    for k in range(n):
        total += k * k % 7
    return total


_init_marker = 0


def mark_worker(worker_id: int) -> None:
    """A user's ``worker_init_fn``: items made after it carry 100 + the worker id."""
    global _init_marker
    _init_marker = 100 + worker_id


def _item(index: int, work: int, sleep_s: float = 0.0) -> torch.Tensor:
    start, cpu0 = time.monotonic_ns(), time.thread_time_ns()
    spin(work)
    cpu = time.thread_time_ns() - cpu0
    if sleep_s:
        time.sleep(sleep_s)  # waiting on something (a file, the network): busy, not on a CPU
    info = get_worker_info()
    worker = info.id if info is not None else -1
    return torch.tensor([index, worker, cpu, start, time.monotonic_ns(), _init_marker])


class TimedDataset(Dataset[torch.Tensor]):
    """``n`` items of ``work`` spins (and ``sleep_s`` of waiting) each; item ``kill_at`` kills
    the worker that makes it."""

    def __init__(self, n: int, work: int, kill_at: int | None = None, sleep_s: float = 0.0) -> None:
        self.n, self.work, self.kill_at, self.sleep_s = n, work, kill_at, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.kill_at and get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return _item(index, self.work, self.sleep_s)


class TimedStream(IterableDataset[torch.Tensor]):
    """An iterable dataset: each worker makes its share (every ``num_workers``-th item)."""

    def __init__(self, n: int, work: int) -> None:
        self.n, self.work = n, work

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        first, every = (info.id, info.num_workers) if info is not None else (0, 1)
        for index in range(first, self.n, every):
            yield _item(index, self.work)


@dataclass
class Logged:
    """What the loop saw: per step, the batch's items (``ITEM_FIELDS`` columns)."""

    steps: list[list[list[int]]] = field(default_factory=list)

    def worker(self, step: int) -> int:
        """The worker that made the step's batch (every item of it)."""
        workers = {item[1] for item in self.steps[step]}
        assert len(workers) == 1, workers
        return workers.pop()

    def cpu_ns(self, step: int) -> int:
        """The dataset's own CPU time for the step's batch."""
        return sum(item[2] for item in self.steps[step])


def run_loop(loader: DataLoader[Any], prof: Any, epochs: int = 1, work_ns: int = 0) -> Logged:
    """Iterate ``loader``, one ``prof.step()`` per batch, logging what each step took."""
    logged = Logged()
    for _ in range(epochs):
        for batch in loader:
            logged.steps.append(batch.tolist())
            if work_ns:
                end = time.monotonic_ns() + work_ns
                while time.monotonic_ns() < end:
                    pass
            prof.step()
    return logged


PROGRAM = """
import sys
import torch
from torch.utils.data import DataLoader
sys.path.insert(0, {root!r})
from tests.dataloader_programs import TimedDataset

loader = DataLoader(TimedDataset(400, 20_000, kill_at={kill_at}), batch_size=2, num_workers=2)
model = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for batch in loader:
    loss = model(batch[:, :1].float()).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("done")
"""
"""A torch program for ``stepscope run``: steps end at the optimizer; one worker may die."""
