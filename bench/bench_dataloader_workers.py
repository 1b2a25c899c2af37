"""DataLoader workers: throughput of a loader's workers with and without stepscope recording them.

1. Worker throughput: a DataLoader with 2 forked workers whose ``__getitem__`` burns 0.5 ms of
   CPU (by its thread's CPU clock), batches of 8, a loop that only takes batches and steps the
   profile (so the workers set the pace), inside one window of ``stepscope.profile``.  Fresh
   processes, alternately with ``dataloader_workers=False`` (A: torch's loop untouched) and
   the default (B: each worker records every batch and samples its stacks at 100 Hz).  Each
   run reports batches/s on the wall clock after a warm-up, and the batches two workers make
   per second of their own CPU over the same batches (every thread of theirs, from the
   scheduler's ``/proc/<pid>/task/<tid>/schedstat``) — the throughput with a free core each,
   which other jobs on a shared machine do not move.  The medians of A
   and B are compared, and the median of the per-pair ratios (goal: B at most 3 % slower).
2. The recording's own cost per batch inside a worker (begin, two collate marks, end on the
   shared ring), timed in this process: what (1) pays per batch besides sampling.
"""

from __future__ import annotations

import statistics
import sys
import time

from harness import Report, run_json_child

CHILD = r"""
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset
import stepscope

record, batches = sys.argv[1] == "1", int(sys.argv[2])

class Items(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, index):
        end = time.thread_time_ns() + 500_000  # 0.5 ms of CPU, however loaded the machine
        total = 0
        while time.thread_time_ns() < end:
            total += index * 3 % 7
        return torch.tensor([index, total])

def workers_cpu_ns(pids):
    # every thread of the workers (the sampler's included): ns on a CPU, from the scheduler
    total = 0
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    return total

loader = DataLoader(Items(), batch_size=8, num_workers=2, multiprocessing_context="fork")
warm = 10
with stepscope.profile(activities=["CPU"], torch_ops=False, dataloader_workers=record) as prof:
    it = iter(loader)
    pids = [w.pid for w in it._workers]
    for n in range(warm + batches):
        next(it)
        if n == warm - 1:
            start, cpu0 = time.perf_counter(), workers_cpu_ns(pids)
        prof.step()
    elapsed, cpu = time.perf_counter() - start, workers_cpu_ns(pids) - cpu0
del it
loaders = prof.trace().metadata.get("stepscope_dataloaders") or []
print(json.dumps([batches / elapsed, 2e9 * batches / cpu, sum(x["batches"] for x in loaders)]))
"""


def _throughput(report: Report, pairs: int, batches: int) -> None:
    wall: dict[str, list[float]] = {"0": [], "1": []}
    cpu: dict[str, list[float]] = {"0": [], "1": []}
    for _ in range(pairs):  # alternating, so drift in the machine's load hits both alike
        for flag in ("0", "1"):
            _, (rate, per_cpu, kept) = run_json_child(
                [sys.executable, "-c", CHILD, flag, str(batches)], timeout=600
            )
            assert (kept > 0) == (flag == "1"), (flag, kept)  # B recorded, A did not
            wall[flag].append(rate)
            cpu[flag].append(per_cpu)
    case = f"2 workers, {batches} batches of 8 x 0.5 ms"
    for what, values, unit in (
        ("wall", wall, "batches/s"),
        ("worker CPU", cpu, "batches/s on 2 free cores"),
    ):
        a = report.add(f"{case}: {what}", "A: dataloader_workers=False", unit, values["0"])
        b = report.add(f"{case}: {what}", "B: recorded (+100 Hz samples)", unit, values["1"])
        report.ratio(f"{case}: {what}", b, a)
        paired = statistics.median(p / r for p, r in zip(values["0"], values["1"], strict=True))
        report.note(
            f"{what}: A/B of the medians {a.median / b.median:.3f}, median of the {pairs} "
            f"per-pair A/B ratios {paired:.3f} (above 1: B slower)"
        )
        if what == "worker CPU":
            report.target(
                "slowdown with recording (worker CPU, A/B medians)", a.median / b.median, 1.03
            )
    report.note(
        "wall batches/s swing with the shared machine's load (2 cores, other jobs); the "
        "workers' own CPU per batch does not: 'batches/s on 2 free cores' is 2 / (the workers' "
        "CPU seconds per batch, every thread of theirs, from the scheduler), what the two "
        "workers make with a core each"
    )


def _record_cost(report: Report, n: int) -> None:
    from stepscope.clock import now_ns
    from stepscope.collectors.dataloader_ring import (
        F_COLLATE_END,
        F_COLLATE_START,
        F_CPU_COLLATE_END,
        F_CPU_COLLATE_START,
        KIND_BATCH,
        Channel,
        WorkerSlot,
    )

    channel = Channel(1)
    slot = WorkerSlot(channel.path, 0)
    channel.arm(True)
    samples = []
    try:
        for _ in range(7):
            start = time.perf_counter_ns()
            for batch in range(n):
                if slot.armed:
                    slot.begin(0, batch, now_ns())
                    slot.mark(F_COLLATE_START, F_CPU_COLLATE_START, now_ns())
                    slot.mark(F_COLLATE_END, F_CPU_COLLATE_END, now_ns())
                    slot.end(KIND_BATCH, now_ns())
            samples.append((time.perf_counter_ns() - start) / n / 1e3)
    finally:
        slot.close()
        channel.close()
    cost = report.add("recording one batch in a worker (ring)", "stepscope", "us/batch", samples)
    report.note(
        f"a 4 ms batch (8 items of 0.5 ms) pays {cost.median:.1f} us of recording: "
        f"{cost.median / 4000:.2%} of its time, before the 100 Hz sampler's share"
    )


def run(report: Report) -> None:
    """Worker throughput with and without recording; the per-batch recording cost."""
    _throughput(report, pairs=3 if report.quick else 11, batches=100 if report.quick else 300)
    _record_cost(report, 2_000 if report.quick else 20_000)
