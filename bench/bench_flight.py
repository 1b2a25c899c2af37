"""The flight recorder's cost: what an always-on ring of the last 100 steps (step rows,
annotations, 100 Hz stacks of every thread) costs the training loops the suite runs.

1. Step time, side by side: the shapes of ``tests/shape_programs.py`` (a plain torch loop, an HF
   ``Trainer``, a Lightning ``fit``) in fresh processes, alternately plain and inside
   ``stepscope.profile(flight_recorder=100, step_on="optimizer")`` (no slow step, no dump: the
   ring alone).  Each process times its own optimizer steps (the interval between the ends of
   two ``Optimizer.step()`` calls, every hook included) after a warm-up; the median step of each
   run is kept and the medians of the runs compared (goal: <= 1 %), with the process's CPU
   time per step (every thread: the sampler's too).
2. Instructions per step (callgrind, repeatable where wall time is not): an empty loop of
   ``record_function`` steps under a profile that records nothing, with and without the ring
   (sampler off: its cost is per second, not per step), at two step counts so start-up cancels.
3. The sampler's own time: its signal handler's and its drain's time per second of a busy
   loop, from its counters (``busy_ms``, ``handler_ms``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import SRC, Report, run_json_child

ROOT = Path(__file__).resolve().parent.parent

SHAPE_CHILD = r"""
import json, os, resource, statistics, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import torch
import tests.shape_programs as sp
cell, flight, iterations = sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
sp.ITERATIONS = iterations
torch.manual_seed(0)
torch.set_num_threads(1)
ends = []
class Meter(sp.Meter):
    def _done(self, opt, args, kwargs):
        ends.append(time.perf_counter_ns())
        super()._done(opt, args, kwargs)
meter = Meter()
tmp = tempfile.mkdtemp()
argv = ["", cell, os.path.join(tmp, "side.json")]
if flight:
    import stepscope
    recorder = stepscope.FlightRecorder(steps=100, out=os.path.join(tmp, "flight"))
    prof = stepscope.profile(flight_recorder=recorder, step_on="optimizer")
    prof.start()
cpu0 = resource.getrusage(resource.RUSAGE_SELF)
{"loop": lambda: sp.loop(meter, 1), "hf": lambda: sp.hf(meter, 1, argv),
 "lightning": lambda: sp.lightning(meter, 1, argv)}[cell]()
cpu1 = resource.getrusage(resource.RUSAGE_SELF)
dumps = 0
if flight:
    prof.stop()
    dumps = len(prof.flight.dumps) if prof.flight is not None else -1
warm = [b - a for a, b in zip(ends, ends[1:])][len(ends) // 5:]
cpu = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) / max(len(ends), 1)
print(json.dumps([statistics.median(warm), cpu, dumps]))
"""

CALLGRIND_CHILD = r"""
import sys
import stepscope
mode, steps = sys.argv[1], int(sys.argv[2])
if mode == "plain":
    for _ in range(steps):
        with stepscope.record_function("step"):
            pass
    raise SystemExit(0)
if mode == "flight":
    recorder = stepscope.FlightRecorder(steps=100, out=sys.argv[3], hang_s=0, slow_min_s=1e6,
                                        sampling_rate_hz=0, attachable=False, on_signal=False)
    prof = stepscope.profile(flight_recorder=recorder, torch_ops=False)
else:
    prof = stepscope.profile(schedule=lambda s: stepscope.ProfilerAction.NONE, torch_ops=False)
with prof:
    for _ in range(steps):
        with stepscope.record_function("step"):
            pass
        prof.step()
"""

SAMPLER_CHILD = r"""
import json, resource, sys, time
import stepscope
rate, work = float(sys.argv[2]), int(sys.argv[3])
recorder = stepscope.FlightRecorder(steps=100, out=sys.argv[1], hang_s=0, slow_min_s=1e6,
                                    attachable=False, sampling_rate_hz=rate)
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
def others_ns():  # CPU ns of every thread but the loop's (schedstat: ns, not clock ticks)
    import os, threading
    main, total = threading.main_thread().native_id, 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != main:
            with open(f"/proc/self/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
    return total
with stepscope.profile(flight_recorder=recorder, torch_ops=False) as prof:
    began, cpu0, others0 = time.perf_counter(), cpu(), others_ns()
    for _ in range(work):
        sum(i * i for i in range(20000))
        prof.step()
    others = others_ns() - others0
    flight = prof.flight
    mode = flight._sampler.mode if flight._sampler is not None else "off"
    flight._stop_sampler()  # its counters: the signal handler's time (in the loop's thread)
    wall, spent = time.perf_counter() - began, cpu() - cpu0
    info = flight._sampler_info
handler = info.get("handler_ms", 0) / 1e3 / wall if info else 0.0
kept = info.get("samples", 0) / wall if info else 0
print(json.dumps([spent, others / 1e9 / wall, handler, mode, kept]))
"""


def _shapes(report: Report, runs: int) -> None:
    cells = (("loop", 300), ("hf", 120), ("lightning", 120))
    for cell, iterations in cells:
        plain: list[float] = []
        flown: list[float] = []
        cpu_plain: list[float] = []
        cpu_flown: list[float] = []
        for _ in range(runs):  # alternating, so drift in the machine's load hits both alike
            for flag, into, cpu in (("0", plain, cpu_plain), ("1", flown, cpu_flown)):
                _, (median_ns, cpu_s, dumps) = run_json_child(
                    [sys.executable, "-c", SHAPE_CHILD, str(ROOT), cell, flag, str(iterations)],
                    timeout=900,
                )
                into.append(median_ns / 1e6)
                cpu.append(cpu_s * 1e3)
                if dumps:
                    report.note(f"{cell}: a run wrote {dumps} dump(s) (a slow step on a busy host)")
        case = f"{cell}: step time, {iterations} optimizer steps per run"
        peer = report.add(case, "plain (no stepscope)", "ms", plain)
        subject = report.add(case, "flight_recorder=100", "ms", flown)
        ratio = report.ratio(case, subject, peer)
        cpu_case = f"{cell}: CPU time per step (all threads)"
        cpu_peer = report.add(cpu_case, "plain (no stepscope)", "ms", cpu_plain)
        cpu_subject = report.add(cpu_case, "flight_recorder=100", "ms", cpu_flown)
        report.ratio(cpu_case, cpu_subject, cpu_peer)
        report.target(f"{cell}: flight/plain step time", ratio, 1.01)


def _instructions(report: Report, tmp: Path) -> dict[str, float]:
    per_step: dict[str, float] = {}
    small, large = 2_000, 12_000
    env = {**os.environ, "PYTHONPATH": SRC}
    for mode in ("plain", "none", "flight"):
        counts = []
        for steps in (small, large):
            out = tmp / f"callgrind.{mode}.{steps}"
            done = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                 sys.executable, "-c", CALLGRIND_CHILD, mode, str(steps), str(tmp / "dumps")],
                capture_output=True, text=True, env=env, timeout=1800,
            )  # fmt: skip
            found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
            if done.returncode != 0 or found is None:
                raise RuntimeError(f"callgrind {mode} failed: {done.stderr[-1500:]}")
            counts.append(int(found.group(1)))
        per_step[mode] = (counts[1] - counts[0]) / (large - small)
    report.add("instructions per step (callgrind)", "record_function only", "Ir/step",
               [per_step["plain"]])  # fmt: skip
    report.add("instructions per step (callgrind)", "profile, no window", "Ir/step",
               [per_step["none"]])  # fmt: skip
    report.add("instructions per step (callgrind)", "flight_recorder=100", "Ir/step",
               [per_step["flight"]])  # fmt: skip
    report.note(
        f"the ring adds {per_step['flight'] - per_step['none']:.0f} instructions per step over a "
        f"profile that records nothing ({per_step['none'] - per_step['plain']:.0f} over the bare "
        "loop), with one record_function span kept per step"
    )
    return per_step


def _sampler(report: Report, work: int, runs: int, tmp: Path) -> None:
    on_cpu: list[float] = []
    off_cpu: list[float] = []
    threads: dict[str, list[float]] = {"100": [], "0": []}
    handler: list[float] = []
    rates: list[float] = []
    mode = ""
    for _ in range(runs):  # alternating, the same work with the sampler at 100 Hz and off
        for rate, into in (("100", on_cpu), ("0", off_cpu)):
            _, (spent, others, in_handler, found, kept) = run_json_child(
                [sys.executable, "-c", SAMPLER_CHILD, str(tmp / "dumps"), rate, str(work)],
                timeout=600,
            )
            into.append(spent)
            threads[rate].append(100 * others)
            if rate != "0":
                handler.append(100 * in_handler)
                rates.append(kept)
                mode = found
    case = f"CPU time of {work} busy steps (all threads)"
    peer = report.add(case, "ring without samples", "s", off_cpu)
    subject = report.add(case, "ring with 100 Hz samples", "s", on_cpu)
    report.ratio(case, subject, peer)
    own = "CPU of stepscope's threads (schedstat)"
    report.add(own, "ring without samples", "% of wall", threads["0"])
    report.add(own, f"ring with 100 Hz samples ({mode})", "% of wall", threads["100"])
    report.add("signal handler in the loop's thread", "ring with 100 Hz samples", "% of wall",
               handler)  # fmt: skip
    report.add("samples kept per second (one busy thread)", "flight_recorder=100", "1/s", rates)
    report.note(
        "the sampler's cost is its threads' CPU time (the kernel's per-thread runtime, "
        "unaffected by other processes) plus its signal handler in the sampled thread (timed "
        "by the wall clock: an upper bound under load); the whole-process CPU ratio above "
        "carries the host's noise"
    )


def run(report: Report) -> None:
    """The ring's cost on the suite's training shapes, per step and per second."""
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        _sampler(report, 500 if report.quick else 2000, 2 if report.quick else 7, tmp)
        if shutil.which("valgrind") is not None:
            _instructions(report, tmp)
        else:
            report.note("valgrind is not installed: no instruction counts")
    _shapes(report, runs=2 if report.quick else 6)
    report.note(
        "step times are medians of per-run medians, runs alternating plain/flight; on a shared "
        "host the run-to-run spread (printed beside each median) is larger than 1 %, so the "
        "instruction counts and the sampler's own time are the repeatable part"
    )
