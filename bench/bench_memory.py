"""The "memory" benchmark: what ``profile_memory=True`` costs, against torch and memray.

Training-style loop (bench_train's MLP): stepscope's ``profile_memory=True`` against torch's
``profile_memory=True, record_shapes=True, with_stack=True`` (the flags torch's memory timeline
needs), both recording every step; then each profiler's ``export_memory_timeline``.
Plain-Python loop (dicts and lists built and dropped, some kept): stepscope's
``profile_memory=True`` against ``memray.Tracker``.
Overhead = profiled time / unprofiled time - 1, all in the same run.
Targets (issue 17): stepscope's overhead <= 0.5x torch's on the training loop; <= memray's on the
plain-Python loop.  Issue 25: the default mode (the C allocation hook) <= torch's overhead on the
training loop, <= 1.05x the unprofiled time on mnist_rnn, <= memray's overhead on
the plain-Python loop (``profile_memory="exact"``, the tracemalloc path, shown beside it); on a
big heap (10 M live blocks, and 1 M tuples kept per step for 6 steps, issue 24), each in its own
child process for its peak RSS: time <= 1.1x the unprofiled loop and peak RSS <= unprofiled +
10 %, with tracemalloc alone as the peer.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_train import make_workload
from harness import Report, run_json_child


def _timed(start: Callable[[], Any], stop: Callable[[], Any], loop: Callable[[], None]) -> float:
    gc.collect()
    begin = time.perf_counter()
    start()
    loop()
    stop()
    return time.perf_counter() - begin


def _timed_split(
    start: Callable[[], Any], stop: Callable[[], Any], loop: Callable[[], None]
) -> tuple[float, float]:
    """(start and the loop, the whole run with stop) in seconds: the steps' own cost apart from
    the window end's."""
    gc.collect()
    begin = time.perf_counter()
    start()
    loop()
    looped = time.perf_counter() - begin
    stop()
    return looped, time.perf_counter() - begin


def python_workload(steps: int, step: Callable[[], None] | None = None) -> None:
    """Records as dicts and lists, most dropped each step, a few kept."""
    kept: list[Any] = []
    for i in range(steps):
        batch = [{"id": j, "name": f"row{j}", "values": list(range(20))} for j in range(2000)]
        kept.append(batch[: 20 + i % 3])
        del batch
        if step is not None:
            step()


def _overheads(
    report: Report, case: str, baseline: Any, runs: dict[str, list[float]]
) -> dict[str, float]:
    found = {}
    best = {}
    for subject, samples in runs.items():
        result = report.add(case, subject, "s", samples)
        found[subject] = result.median / baseline.median - 1
        best[subject] = min(samples) / min(baseline.samples) - 1
    report.note(
        f"{case}: overhead (median) "
        + ", ".join(f"{subject} {value:.2f}x" for subject, value in found.items())
        + "; best of runs "
        + ", ".join(f"{subject} {value:.2f}x" for subject, value in best.items())
        + " (profiled / baseline - 1)"
    )
    return found


def train_case(report: Report, steps: int, repeat: int) -> None:
    import torch.profiler

    import stepscope

    torch.set_num_threads(1)  # one intra-op thread: a shared machine's other load varies less
    train = make_workload(steps)
    train(None)
    base: list[float] = []
    runs: dict[str, list[float]] = {
        "stepscope profile_memory": [],
        "stepscope profile_memory + record_shapes": [],
        "torch.profiler 3 flags": [],
        "stepscope record_shapes only": [],
    }
    timeline: dict[str, list[float]] = {"stepscope": [], "torch.profiler": []}
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(repeat):
            base.append(_timed(lambda: None, lambda: None, lambda: train(None)))
            ours = stepscope.profile(activities=["CPU"], profile_memory=True)
            runs["stepscope profile_memory"].append(
                _timed(ours.start, ours.stop, lambda p=ours: train(p.step))
            )
            # torch's categories in export_memory_timeline need shapes, as torch's export does
            ours = stepscope.profile(activities=["CPU"], profile_memory=True, record_shapes=True)
            runs["stepscope profile_memory + record_shapes"].append(
                _timed(ours.start, ours.stop, lambda p=ours: train(p.step))
            )
            theirs = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU],
                profile_memory=True,
                record_shapes=True,
                with_stack=True,
            )
            runs["torch.profiler 3 flags"].append(
                _timed(theirs.start, theirs.stop, lambda p=theirs: train(p.step))
            )
            shapes = stepscope.profile(activities=["CPU"], record_shapes=True)
            runs["stepscope record_shapes only"].append(
                _timed(shapes.start, shapes.stop, lambda p=shapes: train(p.step))
            )
            begin = time.perf_counter()
            ours.export_memory_timeline(f"{tmp}/ours.json", "cpu")
            timeline["stepscope"].append(time.perf_counter() - begin)
            begin = time.perf_counter()
            theirs.export_memory_timeline(f"{tmp}/theirs.json", "cpu")
            timeline["torch.profiler"].append(time.perf_counter() - begin)
    case = f"train {steps} steps"
    baseline = report.add(case, "no profiler", "s", base)
    over = _overheads(report, f"{case}, loop + stop", baseline, runs)
    s_over, t_over = over["stepscope profile_memory"], over["torch.profiler 3 flags"]
    report.note(
        "train: stepscope profile_memory records no shapes (only export_memory_timeline's "
        "torch categories need them; + record_shapes is the like-for-like with torch's flags "
        "and the profile the timelines are exported from); record_shapes only is the same "
        "torch options without the memory collector and torch's memory events"
    )
    for limit, issue in ((0.5, 17), (1.0, 25)):
        report.target(
            f"train: stepscope profile_memory overhead / torch's (3 flags) <= {limit} "
            f"(issue {issue})",
            s_over / t_over if t_over > 0 else float("inf"),
            limit,
        )
    ours_tl = report.add(f"{case}: export_memory_timeline", "stepscope", "s", timeline["stepscope"])
    torch_tl = report.add(
        f"{case}: export_memory_timeline", "torch.profiler", "s", timeline["torch.profiler"]
    )
    report.ratio("export_memory_timeline", ours_tl, torch_tl)


def python_case(report: Report, steps: int, repeat: int) -> None:
    import stepscope

    try:
        import memray
    except ImportError:
        report.note("memray not installed (bench/requirements.txt): plain-Python case skipped")
        return
    base = [
        _timed(lambda: None, lambda: None, lambda: python_workload(steps)) for _ in range(repeat)
    ]
    case = f"python loop {steps} steps"
    baseline = report.add(case, "no profiler", "s", base)
    runs: dict[str, list[float]] = {
        "stepscope profile_memory": [],
        "memray": [],
        "stepscope exact": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(repeat):
            ours = stepscope.profile(activities=["CPU"], profile_memory=True, torch_ops=False)
            runs["stepscope profile_memory"].append(
                _timed(ours.start, ours.stop, lambda p=ours: python_workload(steps, p.step))
            )
            exact = stepscope.profile(activities=["CPU"], profile_memory="exact", torch_ops=False)
            runs["stepscope exact"].append(
                _timed(exact.start, exact.stop, lambda p=exact: python_workload(steps, p.step))
            )
            tracker = memray.Tracker(str(Path(tmp) / f"memray{n}.bin"))
            runs["memray"].append(
                _timed(
                    tracker.__enter__,
                    lambda t=tracker: t.__exit__(None, None, None),
                    lambda: python_workload(steps),
                )
            )
    over = _overheads(report, case, baseline, runs)
    s_over, m_over = over["stepscope profile_memory"], over["memray"]
    report.target(
        "python: stepscope profile_memory overhead / memray's <= 1",
        s_over / m_over if m_over > 0 else float("inf"),
        1.0,
    )


def make_rnn(steps: int) -> Callable[[Callable[[], None] | None], None]:
    """pytorch/examples' mnist_rnn model (an LSTM over the image's rows) on random data."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)  # one intra-op thread: a shared machine's other load varies less

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = torch.nn.LSTM(input_size=28, hidden_size=64, batch_first=True)
            self.batchnorm = torch.nn.BatchNorm1d(64)
            self.fc1 = torch.nn.Linear(64, 32)
            self.fc2 = torch.nn.Linear(32, 10)

        def forward(self, x: Any) -> Any:
            x, _ = self.rnn(x.reshape(-1, 28, 28))
            x = self.batchnorm(x[:, -1, :])
            x = torch.nn.functional.relu(self.fc1(x))
            return torch.nn.functional.log_softmax(self.fc2(x), dim=1)

    model = Net()
    opt = torch.optim.Adadelta(model.parameters(), lr=0.1)
    data = [(torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))) for _ in range(8)]

    def train(step: Callable[[], None] | None) -> None:
        for i in range(steps):
            x, y = data[i % len(data)]
            opt.zero_grad()
            loss = torch.nn.functional.nll_loss(model(x), y)
            loss.backward()
            opt.step()
            if step is not None:
                step()

    return train


def rnn_case(report: Report, steps: int, repeat: int) -> None:
    """mnist_rnn's loop: unprofiled, stepscope with and without profile_memory, torch's
    profile_memory, alternating."""
    import torch.profiler

    import stepscope

    train = make_rnn(steps)
    train(None)
    runs: dict[str, list[float]] = {
        "no profiler": [],
        "stepscope profile_memory": [],
        "stepscope without memory": [],
        "torch.profiler profile_memory": [],
    }
    loops: dict[str, list[float]] = {name: [] for name in runs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(repeat):
            looped, total = _timed_split(lambda: None, lambda: None, lambda: train(None))
            loops["no profiler"].append(looped)
            runs["no profiler"].append(total)
            for memory in (True, False):
                ours = stepscope.profile(activities=["CPU"], profile_memory=memory)
                name = "stepscope profile_memory" if memory else "stepscope without memory"
                looped, total = _timed_split(ours.start, ours.stop, lambda p=ours: train(p.step))
                loops[name].append(looped)
                runs[name].append(total)
            theirs = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
            )
            looped, total = _timed_split(theirs.start, theirs.stop, lambda p=theirs: train(p.step))
            loops["torch.profiler profile_memory"].append(looped)
            runs["torch.profiler profile_memory"].append(total)
    case = f"mnist_rnn {steps} steps, loop + stop"
    baseline = report.add(case, "no profiler", "s", runs.pop("no profiler"))
    over = _overheads(report, case, baseline, runs)
    report.target(
        "mnist_rnn: stepscope profile_memory time / unprofiled <= 1.05",
        1 + over["stepscope profile_memory"],
        1.05,
    )
    loop_case = f"mnist_rnn {steps} steps, steps only (window end left out)"
    loop_base = report.add(loop_case, "no profiler", "s", loops.pop("no profiler"))
    _overheads(report, loop_case, loop_base, loops)


BIG_HEAP_MODES = ("none", "stepscope", "tracemalloc", "exact", "stepscope without memory")
"""Each big-heap child's mode; the last is the same profile without profile_memory (the window's
own cost, apart from the memory collector's)."""


def big_heap_child(mode: str, live: int, kept_per_step: int, steps: int) -> dict[str, float]:
    """One big-heap run (its own process): ``live`` blocks held before the window, then steps
    that each drop 200 k small objects and keep ``kept_per_step`` tuples; the loop's seconds
    (window start and stop included), wall and CPU, and the process's peak RSS.  stepscope's
    modules are imported first, as a program's imports at its top: ``import stepscope`` loads
    the profiler on first use, and that one-time 0.09 CPU-s is no part of a window's cost."""
    import resource
    import tracemalloc

    import stepscope
    import stepscope.collectors.memory  # what a window with memory loads
    import stepscope.profiler.profile

    held = [(i,) for i in range(live)]
    kept: list[Any] = []
    gc.collect()
    begin, cpu_begin = time.perf_counter(), time.process_time()
    prof: Any = None
    if mode == "tracemalloc":
        tracemalloc.start(1)
    elif mode.startswith("stepscope") or mode == "exact":
        memory: Any = {"stepscope": True, "exact": "exact"}.get(mode, False)
        prof = stepscope.profile(activities=["CPU"], profile_memory=memory, torch_ops=False)
        prof.start()
    for _ in range(steps):
        transient = [str(i) for i in range(200_000)]
        del transient
        kept.append([(i,) for i in range(kept_per_step)])
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.stop()
    if mode == "tracemalloc":
        tracemalloc.stop()
    seconds, cpu = time.perf_counter() - begin, time.process_time() - cpu_begin
    del held, kept
    return {
        "s": seconds,
        "cpu": cpu,
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def big_heap_case(report: Report, live: int, kept: int, steps: int, repeat: int) -> None:
    """Alternating child runs of each mode; time (wall and the process's CPU) and peak RSS
    against the unprofiled run."""
    import sys

    times: dict[str, list[float]] = {mode: [] for mode in BIG_HEAP_MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in BIG_HEAP_MODES}
    rss: dict[str, list[float]] = {mode: [] for mode in BIG_HEAP_MODES}
    for _ in range(repeat):
        for mode in BIG_HEAP_MODES:
            argv = [sys.executable, __file__, mode, str(live), str(kept), str(steps)]
            _, got = run_json_child(argv, timeout=900)
            times[mode].append(got["s"])
            cpu[mode].append(got["cpu"])
            rss[mode].append(got["rss"] / 2**20)
    case = f"big heap: {live:,} live blocks, {kept:,} tuples kept per step, {steps} steps"
    base = report.add(case, "no profiler", "s", times["none"])
    base_cpu = report.add(f"{case}: CPU", "no profiler", "CPU s", cpu["none"])
    base_rss = report.add(f"{case}: peak RSS", "no profiler", "MiB", rss["none"])
    ratios: dict[str, tuple[float, float, float]] = {}
    for mode in BIG_HEAP_MODES[1:]:
        result = report.add(case, mode, "s", times[mode])
        used = report.add(f"{case}: CPU", mode, "CPU s", cpu[mode])
        memory = report.add(f"{case}: peak RSS", mode, "MiB", rss[mode])
        ratios[mode] = (
            result.median / base.median,
            used.median / base_cpu.median,
            memory.median / base_rss.median,
        )
        report.note(
            f"{case}: {mode} {ratios[mode][0]:.2f}x the wall time, {ratios[mode][1]:.2f}x the "
            f"CPU time, peak RSS {ratios[mode][2]:.2f}x"
        )
    wall, cpu_ratio, rss_ratio = ratios["stepscope"]
    report.target(f"{case}: stepscope time / unprofiled <= 1.1", wall, 1.1)
    report.target(f"{case}: stepscope CPU time / unprofiled <= 1.1", cpu_ratio, 1.1)
    report.target(f"{case}: stepscope peak RSS / unprofiled <= 1.1", rss_ratio, 1.1)


def run(report: Report) -> None:
    """Run the memory benchmark."""
    repeat = 3 if report.quick else 7
    try:
        import torch  # noqa: F401
    except ImportError:
        report.note("torch not installed: training case skipped")
    else:
        train_case(report, 20 if report.quick else 40, repeat)
        rnn_case(report, 20 if report.quick else 60, repeat)
        rnn_run_case(report, 100 if report.quick else 600, 3 if report.quick else 5)
    python_case(report, 20 if report.quick else 40, repeat)
    big = 2_000_000 if report.quick else 10_000_000
    big_heap_case(report, big, 0, 6, 1 if report.quick else 3)
    big_heap_case(report, 0, 1_000_000, 6, 1 if report.quick else 3)


RUN_SCHEDULE = {"wait": 1, "warmup": 1, "active": 5}
"""``stepscope run --memory``'s default schedule (one window of LEAK_MIN_STEPS + 1 steps)."""


def rnn_program(steps: int, torch_profiler: bool) -> None:
    """mnist_rnn's training as a program (what ``python prog.py`` runs), optionally under
    torch's ``profile_memory`` on the same schedule as ``stepscope run --memory``'s default."""
    train = make_rnn(steps)
    if not torch_profiler:
        train(None)
        return
    import torch.profiler

    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        profile_memory=True,
        schedule=torch.profiler.schedule(**RUN_SCHEDULE),
    ) as prof:
        train(prof.step)


def rnn_run_case(report: Report, steps: int, repeat: int) -> None:
    """The whole program, as a user runs it: ``python prog.py`` against ``stepscope run
    --memory prog.py`` (its defaults: steps found by the optimizer, one window) and the program
    under torch's profiler on the same schedule; process wall time, alternating."""
    import subprocess
    import sys

    from harness import SRC

    env = dict(os.environ, PYTHONPATH=SRC, PYTHONWARNINGS="ignore")
    prog = [__file__, "rnn", str(steps)]
    commands = {
        "python prog.py": [sys.executable, *prog, "plain"],
        "stepscope run --memory": [
            sys.executable,
            "-m",
            "stepscope",
            "run",
            "--memory",
            "-o",
            "{out}",
            *prog,
            "plain",
        ],
        "torch.profiler profile_memory, same schedule": [sys.executable, *prog, "torch"],
    }
    import resource

    def children_cpu() -> float:
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        return used.ru_utime + used.ru_stime

    times: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            for name, argv in commands.items():
                argv = [a.replace("{out}", tmp) for a in argv]
                begin, cpu_begin = time.perf_counter(), children_cpu()
                done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
                times[name].append(time.perf_counter() - begin)
                cpu[name].append(children_cpu() - cpu_begin)
                if done.returncode != 0:
                    raise RuntimeError(f"{name} failed: {done.stderr[-2000:]}")
    case = f"mnist_rnn program, {steps} steps, whole process"
    baseline = report.add(case, "python prog.py", "s", times.pop("python prog.py"))
    over = _overheads(report, case, baseline, times)
    cpu_case = f"{case}, CPU time (user + sys)"
    cpu_baseline = report.add(cpu_case, "python prog.py", "CPU s", cpu.pop("python prog.py"))
    cpu_over = _overheads(report, cpu_case, cpu_baseline, cpu)
    report.note(
        "mnist_rnn program: on a shared machine the processes' CPU time is the steadier measure "
        "(the wall time of one run moves by tens of percent with the other jobs' load)"
    )
    report.target(
        "mnist_rnn program: stepscope run --memory time / unprofiled <= 1.05",
        1 + over["stepscope run --memory"],
        1.05,
    )
    report.target(
        "mnist_rnn program: stepscope run --memory CPU time / unprofiled <= 1.05",
        1 + cpu_over["stepscope run --memory"],
        1.05,
    )


if __name__ == "__main__":
    import json
    import sys

    if sys.argv[1] == "rnn":  # the mnist_rnn program: steps, plain or torch
        rnn_program(int(sys.argv[2]), sys.argv[3] == "torch")
    else:  # one big-heap child run: mode, live blocks, kept per step, steps
        mode, live, kept, steps = sys.argv[1], *map(int, sys.argv[2:5])  # mode may hold spaces
        print(json.dumps(big_heap_child(mode, live, kept, steps)))
