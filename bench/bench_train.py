"""The "train" workload: an MLP on random data, ~50 steps, profiled by stepscope and torch.profiler.

For each option set (CPU; CPU + shapes; CPU + stack) both profilers record every step and write
their trace at the end.  Overhead = profiled time / unprofiled time - 1, in the same run, for the
loop while recording and, separately, including the window end (stop + trace export).
Targets (issue 9): stepscope's overhead <= torch's for each option; stepscope's .json <= 0.6x
torch's bytes for the same events.  Issue 19: the window end alone (stop + trace written) no
slower than torch.profiler's stop + export_chrome_trace, for each option; and the two ways of
taking torch's events (Kineto's file read back in C, or ``kineto_results.events()`` in memory)
side by side, which decided the first.
"""

from __future__ import annotations

import gc
import json
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Report

OPTIONS = {
    "CPU": {},
    "CPU + shapes": {"record_shapes": True},
    "CPU + stack": {"with_stack": True},
}


def make_workload(steps: int) -> Callable[[Callable[[], None] | None], None]:
    """A training loop; the argument is called after each step (the profiler's step)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(64, 256), torch.randint(0, 10, (64,))) for _ in range(8)]
    loss_fn = torch.nn.CrossEntropyLoss()

    def train(step: Callable[[], None] | None) -> None:
        for i in range(steps):
            x, y = data[i % len(data)]
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step is not None:
                step()

    return train


def timed_profile(prof: Any, train: Any, out: Path) -> tuple[float, float]:
    """(seconds of the profiled loop, seconds to stop and write the trace)."""
    gc.collect()  # start every timed run from the same heap
    prof.start()
    start = time.perf_counter()
    train(prof.step)
    loop = time.perf_counter() - start
    prof.stop()
    prof.export_chrome_trace(str(out))
    return loop, time.perf_counter() - start - loop


def run_torch(train: Any, options: dict[str, Any], out: Path) -> tuple[float, float]:
    """torch.profiler with ``options``: (loop seconds, stop + export seconds)."""
    from torch.profiler import ProfilerActivity, profile

    return timed_profile(profile(activities=[ProfilerActivity.CPU], **options), train, out)


def run_stepscope(train: Any, options: dict[str, Any], out: Path) -> tuple[float, float]:
    """stepscope with ``options``: (loop seconds, stop + export seconds)."""
    import stepscope

    prof = stepscope.profile(activities=[stepscope.ProfilerActivity.CPU], **options)
    return timed_profile(prof, train, out)


def events_routes(
    report: Report, train: Any, label: str, options: dict[str, Any], d: Path, repeat: int
) -> None:
    """After torch's stop: Kineto's file saved and read back (every event, args, flows and
    metadata) against ``events()`` in memory, with a few fields per event (a lower bound for
    that route) and with the fields the file carries (ids, flows, ``metadata_json``, shapes or
    stack as recorded; still no columns built and no metadata events)."""
    import torch.autograd.profiler as autograd_profiler

    from stepscope.trace.chrome_reader import read_chrome_trace

    def stopped() -> Any:
        prof = autograd_profiler.profile(use_kineto=True, acc_events=False, **options)
        prof._prepare_trace()
        prof._start_trace()
        train(None)
        prof.__exit__(None, None, None)
        return prof.kineto_results

    def by_file(results: Any) -> float:
        start = time.perf_counter()
        results.save(str(d / "kineto.json"))
        read_chrome_trace(d / "kineto.json", drop_kineto_bookkeeping=True)
        return time.perf_counter() - start

    def in_memory(results: Any, every_field: bool) -> float:
        start = time.perf_counter()
        shapes, stack = options.get("record_shapes"), options.get("with_stack")
        for e in results.events():
            (e.name(), e.start_ns(), e.duration_ns(), e.start_thread_id(), e.correlation_id())
            if every_field:
                (e.device_type(), e.device_index(), e.activity_type(), e.external_id())
                (e.sequence_nr(), e.fwd_thread_id(), e.flow_id(), e.flow_type())
                (e.flow_start(), e.metadata_json())
                if shapes:
                    (e.shapes(), e.dtypes(), e.concrete_inputs())
                if stack:
                    e.stack()
        return time.perf_counter() - start

    files, few, every = [], [], []
    for _ in range(repeat):
        results = stopped()
        files.append(by_file(results))
        few.append(in_memory(results, every_field=False))
        every.append(in_memory(results, every_field=True))
    case = f"torch's events after stop, {label}"
    file_route = report.add(case, "save + read back in C", "s", files)
    lower = report.add(case, "events() + 5 fields/event", "s", few)
    fields = report.add(case, "events() + the file's fields", "s", every)
    report.ratio(f"{label}: file route / in-memory lower bound", file_route, lower)
    report.ratio(f"{label}: file route / in-memory with the file's fields", file_route, fields)


def event_count(path: Path) -> int:
    return len(json.loads(path.read_text())["traceEvents"])


def run(report: Report) -> None:
    """Run the train benchmark."""
    try:
        import torch  # noqa: F401
    except ImportError:
        report.note("torch not installed: train benchmark skipped")
        return
    steps = 20 if report.quick else 50
    repeat = 3 if report.quick else 9
    train = make_workload(steps)
    train(None)  # warm up allocators and the autograd graph
    base = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        train(None)
        base.append(time.perf_counter() - start)
    baseline = report.add(f"train {steps} steps", "no profiler", "s", base)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = Path(tmp)
        for label, options in OPTIONS.items():
            t_runs, s_runs = [], []
            try:
                for _ in range(repeat):
                    t_runs.append(run_torch(train, options, d / "torch.json"))
                    s_runs.append(run_stepscope(train, options, d / "stepscope.json"))
            except (NotImplementedError, ValueError) as exc:
                report.note(f"{label}: stepscope cannot run it ({exc})")
                continue
            case = f"train {steps} steps, {label}"
            t_loop = report.add(f"{case}: loop", "torch.profiler", "s", [r[0] for r in t_runs])
            s_loop = report.add(f"{case}: loop", "stepscope", "s", [r[0] for r in s_runs])
            t_end = report.add(
                f"{case}: loop + stop + export", "torch.profiler", "s", [sum(r) for r in t_runs]
            )
            s_end = report.add(
                f"{case}: loop + stop + export", "stepscope", "s", [sum(r) for r in s_runs]
            )
            t_over = t_loop.median / baseline.median - 1
            s_over = s_loop.median / baseline.median - 1
            report.note(
                f"{label}: overhead while recording: stepscope {s_over:.2f}x, torch.profiler "
                f"{t_over:.2f}x (profiled loop / baseline - 1)"
            )
            report.target(
                f"{label}: stepscope loop overhead / torch loop overhead <= 1",
                s_over / t_over if t_over > 0 else float("inf"),
                1.0,
            )
            t_all = t_end.median / baseline.median - 1
            s_all = s_end.median / baseline.median - 1
            report.note(
                f"{label}: overhead including stop + trace export: stepscope {s_all:.2f}x, "
                f"torch.profiler {t_all:.2f}x (ratio {s_all / t_all:.2f}; stepscope also merges "
                "torch's events into its own trace at the window end)"
            )
            t_stop = report.add(
                f"{case}: window end (stop + export)", "torch.profiler", "s", [r[1] for r in t_runs]
            )
            s_stop = report.add(
                f"{case}: window end (stop + export)", "stepscope", "s", [r[1] for r in s_runs]
            )
            end_ratio = report.ratio(f"{label}: window end, lower is better", s_stop, t_stop)
            report.target(f"{label}: stepscope window end / torch's <= 1.0", end_ratio, 1.0)
            events_routes(report, train, label, options, d, repeat)
            t_bytes = (d / "torch.json").stat().st_size
            s_bytes = (d / "stepscope.json").stat().st_size
            t_events, s_events = event_count(d / "torch.json"), event_count(d / "stepscope.json")
            report.note(
                f"{label}: trace bytes stepscope {s_bytes} ({s_events} events, "
                f"{s_bytes / s_events:.0f} B/event), torch {t_bytes} ({t_events} events, "
                f"{t_bytes / t_events:.0f} B/event)"
            )
            report.target(
                f"{label}: stepscope bytes/event / torch bytes/event <= 0.6",
                (s_bytes / s_events) / (t_bytes / t_events),
                0.6,
            )
