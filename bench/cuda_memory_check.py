"""CUDA check of memory per step: the report's figures against what the program measured itself.

Run on a machine with an NVIDIA GPU and a CUDA build of torch:

    python bench/cuda_memory_check.py [OUT_DIR]

A small MLP trains on the GPU under ``profile(profile_memory=True)`` and keeps 1 MiB of GPU
memory per step (a leak).  At every step end, just before ``step()``, the program reads
``torch.cuda.memory_allocated()`` and ``memory_reserved()`` itself.  The check: each recorded
step's CUDA allocator row equals the program's reading; the tensors held at the step end (from
torch's memory events) equal it within 1 %; the leak hint names ``cuda:0`` at 1 MiB a step
within 5 %.  Then the overhead: seconds per step unprofiled, under stepscope and under
torch.profiler with ``profile_memory=True`` on the same schedule, alternating.  Exits non-zero
when a check fails (2 when there is no GPU).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MIB = 1 << 20
STEPS = 12


def train(steps: int, step: Any, measured: dict[int, tuple[int, int]] | None = None) -> float:
    """``steps`` training steps on the GPU keeping 1 MiB a step; seconds per step."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for i in range(steps):
        x = torch.randn(512, 1024, device="cuda")
        y = torch.randint(0, 10, (512,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        kept.append(torch.empty(MIB, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        if measured is not None:
            measured[i] = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
        if step is not None:
            step()
    torch.cuda.synchronize()
    return (time.perf_counter() - begin) / steps


def check_memory(out_dir: Path) -> list[str]:
    """Profile the loop with memory and compare the report with the program's own readings."""
    import stepscope
    from stepscope.analysis.analyze import analyze
    from stepscope.trace.chrome_reader import read_chrome_trace

    measured: dict[int, tuple[int, int]] = {}
    with stepscope.profile(
        activities=["CPU", "CUDA"],
        profile_memory=True,
        schedule=stepscope.schedule(wait=1, warmup=1, active=8, repeat=1),
        on_trace_ready=stepscope.trace_handler(out_dir),
    ) as prof:
        train(STEPS, prof.step, measured)
    files = sorted(out_dir.glob("*.json*"))
    print(f"trace: {files}")
    traces = [(f.name, read_chrome_trace(f)) for f in files]
    report = analyze(traces, None, 10, [])
    memory = report.files[0].memory
    failures: list[str] = []
    if memory is None:
        return ["no memory section in the report"]
    for s in memory.steps:
        allocated, reserved = measured[s.step]
        cuda = s.cuda_allocator
        held = s.tensor_current.get("cuda:0")
        print(
            f"step {s.step}: program allocated {allocated:,} reserved {reserved:,}; "
            f"stepscope allocator {cuda}; tensors held {held}; peak {s.tensor_peak.get('cuda:0')}"
        )
        if cuda.get("allocated") != allocated or cuda.get("reserved") != reserved:
            failures.append(f"step {s.step}: allocator row {cuda} != ({allocated}, {reserved})")
        if held is None or abs(held - allocated) > 0.01 * allocated:
            failures.append(f"step {s.step}: tensors held {held} vs allocated {allocated}")
    cuda_leaks = [h for h in memory.leaks if h.kind == "cuda:0"]
    print("leaks:", memory.leaks)
    print("notes:", memory.notes)
    print("peak:", memory.peak_kind, memory.peak_step, memory.peak_bytes, memory.peak_table[:5])
    if not cuda_leaks or abs(cuda_leaks[0].per_step_bytes - MIB) > 0.05 * MIB:
        failures.append(f"no 1 MiB/step cuda:0 leak hint: {memory.leaks}")
    return failures


def overhead(rounds: int = 3) -> None:
    """Seconds per step: unprofiled, stepscope memory, torch.profiler memory; alternating."""
    import torch.profiler

    import stepscope

    out = Path(tempfile.mkdtemp())  # both write their traces, as a user's run does

    def ours(memory: bool = True) -> float:
        with stepscope.profile(
            activities=["CPU", "CUDA"],
            profile_memory=memory,
            schedule=stepscope.schedule(wait=1, warmup=1, active=20, repeat=1),
            on_trace_ready=stepscope.trace_handler(out / "stepscope"),
        ) as prof:
            return train(40, prof.step)

    def torchs() -> float:
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
            profile_memory=True,
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=20, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(out / "torch")),
        ) as prof:
            return train(40, prof.step)

    subjects = {
        "unprofiled": lambda: train(40, None),
        "stepscope": ours,
        "stepscope without memory": lambda: ours(False),
        "torch.profiler": torchs,
    }
    times: dict[str, list[float]] = {name: [] for name in subjects}
    train(10, None)  # warm the GPU and cuBLAS
    for _ in range(rounds):
        for name, run in subjects.items():
            times[name].append(run())
    base = statistics.median(times["unprofiled"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"overhead: {name}: {med * 1e3:.2f} ms/step, {med / base:.2f}x unprofiled {values}")


def stats_cost() -> None:
    """Microseconds per call of what the memory collector reads at every step end."""
    import torch

    from stepscope.collectors.memory import _cuda_allocator_stats
    from stepscope.rss import RssReader, rss_bytes

    reader = RssReader()
    calls = {
        "torch.cuda.memory_stats()": torch.cuda.memory_stats,
        "torch.cuda.memory_stats_as_nested_dict()": torch.cuda.memory_stats_as_nested_dict,
        "stepscope's allocator row": _cuda_allocator_stats,
        "rss_bytes() (open, read)": rss_bytes,
        "RssReader.read() (pread)": reader.read,
    }
    for name, call in calls.items():
        begin = time.perf_counter()
        for _ in range(200):
            call()
        print(f"cost: {name}: {(time.perf_counter() - begin) / 200 * 1e6:.1f} us")
    reader.close()


def main(out_dir: Path) -> int:
    """Run the checks; the exit status."""
    import torch

    if not torch.cuda.is_available():
        print("cuda_memory_check: no CUDA device here; nothing checked")
        return 2
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    out_dir.mkdir(parents=True, exist_ok=True)
    failures = check_memory(out_dir)
    stats_cost()
    overhead()
    for failure in failures:
        print("FAIL:", failure)
    print("cuda_memory_check:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "out/cuda_memory_check")))
