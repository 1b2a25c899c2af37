"""The function tracer beside cProfile, VizTracer, pyinstrument and yappi on a call-heavy workload.

Workload: recursive fib plus a method-heavy loop, ~1 s untraced (a tenth with --quick).  Every
subject runs once per round, rounds interleaved, so drift on a shared machine hits all alike.
Overhead = traced time / baseline - 1.  The floor is a no-op C hook on the same events (a
profile function on 3.10/3.11, sys.monitoring callbacks on 3.12+) from the benchmarks' own
module ``_bench_hooks`` (``bench/hooks``, built by ``make bench``; never in the package's
extension).

Targets (issue 4): stepscope's overhead <= 0.8 x the smallest of cProfile's and VizTracer's, and
<= 1.5 x the floor's; <= 24 bytes per recorded call in memory; a NONE-phase step costs the same
with and without with_stack=True.  Also reported: bytes per call on disk (.json, .json.gz).

Then each tracer in its own process (``tracer_child.py``, imports outside the timing), rounds
interleaved (issue 19): recording overhead on a mixed (fib + 800k method calls) and a
method-only workload, <= 0.8 x the best of cProfile and VizTracer; start to a written ``.json``
<= 0.4 x VizTracer's (record + stop + save); ``.json`` bytes per call <= 0.8 x VizTracer's;
stop() <= 100 ns per span; and past the default budget (4M calls, the oldest dropped) how long
stop() takes beside the workload; and the 1 kHz sampler's slowdown with start and stop included
(<= 1.10x).  ``STEPSCOPE_BENCH_PYTHONS`` (paths joined by ``:``) adds interpreters to this part,
e.g. a Python 3.12 venv for the ``sys.monitoring`` path (each needs the extension and the hooks
built for it: ``setup.py build_ext --inplace`` and ``bench/hooks/build.py``).
"""

from __future__ import annotations

import cProfile
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Report, run_json_child
from stepscope import clock
from stepscope._ext import native
from stepscope.collectors.base import WindowContext
from stepscope.collectors.python import PythonTracerCollector
from stepscope.trace.chrome_writer import write_chrome_trace
from stepscope.trace.model import TraceBuilder


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


class Vec:
    __slots__ = ("x", "y")

    def __init__(self, x: float, y: float) -> None:
        self.x = x
        self.y = y

    def add(self, other: Vec) -> Vec:
        return Vec(self.x + other.x, self.y + other.y)

    def norm2(self) -> float:
        return self.x * self.x + self.y * self.y


def methods(n: int) -> float:
    acc = Vec(0.0, 0.0)
    total = 0.0
    for i in range(n):
        v = Vec(float(i), 1.0)
        acc = acc.add(v)
        total += v.norm2()
    return total + acc.norm2()


def make_workload(seconds: float) -> tuple[Callable[[], None], int]:
    """A workload of about ``seconds`` untraced, and how many Python calls it makes."""
    unit = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fib(20)
        methods(20_000)
        unit = min(unit, time.perf_counter() - start)  # fib(20): 21891 calls, methods: 80001
    reps = max(1, round(seconds / unit))

    def workload() -> None:
        for _ in range(reps):
            fib(20)
            methods(20_000)

    return workload, reps * (21891 + 80001)


# -- subjects: (start, stop) around the workload ------------------------------------------------


def _stepscope(**options: Any) -> tuple[Callable[[], None], Callable[[], None]]:
    collector = PythonTracerCollector(**options)
    ctx = WindowContext(window=0)

    def start() -> None:
        collector.prepare(ctx)
        collector.start(ctx)

    def stop() -> None:
        collector.stop(ctx)
        collector.close()

    return start, stop


HOOKS_HINT = "python bench/hooks/build.py builds them"


def _hooks() -> Any:
    """The ``_bench_hooks`` module (``bench/hooks/build.py`` builds it), or None."""
    try:
        import _bench_hooks
    except ImportError:
        return None
    return _bench_hooks


def _floor() -> tuple[Callable[[], None], Callable[[], None]] | None:
    mod = _hooks()
    if mod is None:
        return None
    if sys.version_info < (3, 12):
        return (lambda: mod.floor_profile(True)), (lambda: mod.floor_profile(False))
    mon = sys.monitoring  # type: ignore[attr-defined]
    ev = mon.events
    events = [ev.PY_START, ev.PY_RESUME, ev.PY_RETURN, ev.PY_YIELD, ev.PY_UNWIND, ev.PY_THROW]
    tool = 3

    def start() -> None:
        mon.use_tool_id(tool, "bench-floor")
        mask = 0
        for e in events:
            mon.register_callback(tool, e, mod.mon_noop)
            mask |= e
        mon.set_events(tool, mask)

    def stop() -> None:
        mon.set_events(tool, 0)
        for e in events:
            mon.register_callback(tool, e, None)
        mon.free_tool_id(tool)

    return start, stop


def _cprofile() -> tuple[Callable[[], None], Callable[[], None]]:
    prof = cProfile.Profile()
    return prof.enable, prof.disable


def _viztracer(**options: Any) -> tuple[Callable[[], None], Callable[[], None]] | None:
    try:
        from viztracer import VizTracer
    except ImportError:
        return None
    tracer = VizTracer(verbose=0, **options)

    def stop() -> None:
        tracer.stop()
        tracer.clear()

    return tracer.start, stop


def _pyinstrument() -> tuple[Callable[[], None], Callable[[], None]] | None:
    try:
        from pyinstrument import Profiler
    except ImportError:
        return None
    holder: list[Any] = []

    def start() -> None:
        holder[:] = [Profiler()]
        holder[0].start()

    def stop() -> None:
        holder[0].stop()

    return start, stop


def _yappi() -> tuple[Callable[[], None], Callable[[], None]] | None:
    try:
        import yappi
    except ImportError:
        return None

    def start() -> None:
        yappi.set_clock_type("wall")
        yappi.start()

    def stop() -> None:
        yappi.stop()
        yappi.clear_stats()

    return start, stop


def _timed(workload: Callable[[], None], hooks: tuple[Callable[[], None], ...] | None) -> float:
    if hooks is not None:
        hooks[0]()
    t0 = time.perf_counter()
    workload()
    elapsed = time.perf_counter() - t0
    if hooks is not None:
        hooks[1]()
    return elapsed


def _bytes_per_event(report: Report) -> None:
    """Memory per recorded call, and file bytes per call, on a window within the budget."""
    n = 22 if report.quick else 26
    collector = PythonTracerCollector(include=("bench_tracer", "__main__"))
    ctx = WindowContext(window=0)
    collector.prepare(ctx)
    collector.start(ctx)
    fib(n)
    collector.stop(ctx)
    stats = collector._stats
    calls = int(stats["events"])
    if "peak_chunk_bytes" in stats:
        per_event = stats["peak_chunk_bytes"] / calls
        report.add("memory per recorded call", collector.implementation, "bytes", [per_event])
        report.target("stepscope in-memory bytes per call <= 24", per_event, 24)
        report.note(f"record size {native().TRACER_RECORD_BYTES} bytes; {calls} calls recorded")
    builder = TraceBuilder()
    t0 = time.perf_counter()
    collector.collect(builder, ctx)
    collect_s = time.perf_counter() - t0
    report.add("collect into the trace", "stepscope", "ns/call", [collect_s * 1e9 / calls])
    trace = builder.build()
    with tempfile.TemporaryDirectory() as tmp:
        for suffix in (".json", ".json.gz"):
            path = Path(tmp) / f"trace{suffix}"
            write_chrome_trace(trace, path)
            size = os.path.getsize(path) / len(trace.spans)
            report.add(f"file bytes per call ({suffix})", "stepscope", "bytes", [size])


def _none_step_cost(report: Report, repeat: int) -> None:
    """A step in NONE with and without with_stack=True (the tracer must cost nothing there)."""
    try:
        import stepscope
    except ImportError:
        return
    n = 20_000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        never = stepscope.schedule(wait=10**9, warmup=1, active=1)
    results = []
    for with_stack in (False, True):
        prof = stepscope.profile(schedule=never, with_stack=with_stack)
        prof.start()

        def steps(prof: Any = prof) -> None:
            for _ in range(n):
                prof.step()

        results.append(
            report.measure(
                "step() in NONE", f"with_stack={with_stack}", steps, per_call=n, repeat=repeat
            )
        )
        prof.stop()
    ratio = report.ratio("step() in NONE", results[1], results[0])
    report.target("NONE step with_stack=True / with_stack=False <= 1.1", ratio, 1.1)


CHILD = Path(__file__).with_name("tracer_child.py")


def _child(python: str, subject: str, workload: str, out: Path) -> dict[str, float]:
    """One run of ``tracer_child.py`` in a fresh process of ``python``."""
    _, found = run_json_child(
        [python, str(CHILD), subject, workload, str(out)], cwd=str(CHILD.parent)
    )
    out.unlink(missing_ok=True)
    result: dict[str, float] = found
    return result


def _tsc_read_ns() -> float:
    """Nanoseconds per clock read of the tracer (``ss_ticks()`` in a C loop, from the source
    ``stepscope.clock`` chose; 0 without the hooks)."""
    mod = _hooks()
    if mod is None:
        return 0.0
    mod._clock_configure(clock.SOURCE == "tsc")
    n = 2_000_000
    start = time.perf_counter()
    mod.clock_reads(n)
    return (time.perf_counter() - start) * 1e9 / n


def _version(python: str) -> str:
    """``3.12`` for an interpreter's path."""
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout


def _separate_processes(report: Report, python: str) -> None:
    """Each tracer in its own process: overhead, time to a written trace, bytes, stop()."""
    from tracer_child import CALLS  # it imports this module's workload functions

    rounds = 2 if report.quick else 5
    version = _version(python).strip()
    subjects = ["none", "stepscope", "sampler", "cprofile"]
    has_hooks = subprocess.run(
        [python, "-c", "import _bench_hooks"], capture_output=True, cwd=str(CHILD.parent)
    ).returncode
    if has_hooks != 0:
        report.note(f"the floor: no bench hooks for Python {version} ({HOOKS_HINT}), skipped")
    else:
        subjects.insert(1, "floor")
    has_viz = subprocess.run([python, "-c", "import viztracer"], capture_output=True).returncode
    if has_viz != 0:
        report.note(f"VizTracer: not installed for Python {version}, skipped")
    else:
        subjects.append("viztracer")
    with tempfile.TemporaryDirectory() as tmp:
        for workload in ("mixed", "methods"):
            runs: dict[str, list[dict[str, float]]] = {s: [] for s in subjects}
            for _ in range(rounds):
                for subject in subjects:
                    runs[subject].append(_child(python, subject, workload, Path(tmp) / "t.json"))
            case = f"py{version} {workload}, own process"
            res = {
                s: report.add(f"{case}: start to last call", s, "s", [r["record"] for r in rs])
                for s, rs in runs.items()
            }
            base = res["none"].median
            over = {s: r.median / base - 1 for s, r in res.items() if s not in ("none", "sampler")}
            peers = [over[s] for s in ("cprofile", "viztracer") if s in over]
            report.note(f"{case}: overhead " + ", ".join(f"{s} {v:.1%}" for s, v in over.items()))
            calls = CALLS[workload]
            if "floor" in res:
                floor_ns = (res["floor"].median - base) * 1e9 / calls
                ours_ns = (res["stepscope"].median - res["floor"].median) * 1e9 / calls
                report.note(
                    f"{case}: the no-op hook costs {floor_ns:.0f} ns per call, stepscope "
                    f"{ours_ns:.0f} ns more (two clock reads: {2 * _tsc_read_ns():.0f} ns)"
                )
            report.target(
                f"py{version} {workload}: stepscope overhead / min(cProfile, VizTracer) <= 0.8",
                over["stepscope"] / min(peers),
                0.8,
            )
            if workload == "mixed":
                sampled = report.add(
                    f"{case}: start + workload + stop",
                    "sampler 1 kHz",
                    "s",
                    [r["record"] + r["stop"] for r in runs["sampler"]],
                )
                slowdown = report.ratio(case, sampled, res["none"])
                report.target(
                    f"py{version} sampler at 1 kHz, start and stop included <= 1.10x", slowdown, 1.1
                )
            ours = runs["stepscope"]
            stop = report.add(
                f"{case}: stop() per span",
                "stepscope",
                "ns/span",
                [r["stop"] * 1e9 / r["events"] for r in ours],
            )
            report.target(f"py{version} {workload}: stop() ns per span <= 100", stop.median, 100)
            if "viztracer" not in runs:
                continue
            theirs = runs["viztracer"]
            total = {
                s: report.add(f"{case}: start to written .json", s, "s", [r["total"] for r in rs])
                for s, rs in (("stepscope", ours), ("viztracer", theirs))
            }
            ratio = report.ratio(
                f"{case}: to written .json", total["stepscope"], total["viztracer"]
            )
            report.target(
                f"py{version} {workload}: start to .json / VizTracer's <= 0.4", ratio, 0.4
            )
            per_call = {
                s: report.add(
                    f"{case}: .json bytes per call",
                    s,
                    "bytes",
                    [r["bytes"] / r["events"] for r in rs],
                )
                for s, rs in (("stepscope", ours), ("viztracer", theirs))
            }
            ratio = report.ratio(f"{case}: bytes", per_call["stepscope"], per_call["viztracer"])
            report.target(
                f"py{version} {workload}: .json bytes per call / VizTracer's <= 0.8", ratio, 0.8
            )
        big = [
            _child(python, "stepscope", "over_budget", Path(tmp) / "t.json") for _ in range(rounds)
        ]
    record = report.add(
        f"py{version} 4M calls, oldest dropped: start to last call",
        "stepscope",
        "s",
        [r["record"] for r in big],
    )
    stop = report.add(
        f"py{version} 4M calls, oldest dropped: stop()", "stepscope", "s", [r["stop"] for r in big]
    )
    report.note(f"py{version} over the budget: {big[0]['events']:.0f} spans kept of 4000001 calls")
    report.target(
        f"py{version} over budget: stop() / recording time <= 0.5", stop.median / record.median, 0.5
    )


def run(report: Report) -> None:
    """Run the tracer benchmark."""
    seconds = 0.1 if report.quick else 1.0
    rounds = 2 if report.quick else 3
    workload, calls = make_workload(seconds)
    report.note(f"workload: {calls} Python calls per run, Python {sys.version.split()[0]}")
    subjects: dict[str, tuple[Callable[[], None], Callable[[], None]] | None] = {
        "baseline": None,
        "no-op C hook (floor)": _floor(),
        "stepscope": _stepscope(),
        "cProfile": _cprofile(),
        "VizTracer": _viztracer(),
        "VizTracer ignore_c_function": _viztracer(ignore_c_function=True),
        "pyinstrument (wall)": _pyinstrument(),
        "yappi (wall)": _yappi(),
    }
    missing = [name for name, hooks in subjects.items() if hooks is None and name != "baseline"]
    for name in missing:
        where = HOOKS_HINT if "floor" in name else "bench/requirements.txt"
        report.note(f"{name}: not installed, skipped ({where})")
        del subjects[name]
    samples: dict[str, list[float]] = {name: [] for name in subjects}
    workload()  # warm up
    for _ in range(rounds):
        for name, hooks in subjects.items():
            samples[name].append(_timed(workload, hooks))
    results = {name: report.add("call-heavy workload", name, "s", s) for name, s in samples.items()}
    base = results["baseline"].median
    overhead = {name: r.median / base - 1 for name, r in results.items() if name != "baseline"}
    for name, value in overhead.items():
        report.note(f"overhead {name}: {value:.1%}")
    ours = overhead["stepscope"]
    peers = [
        overhead[n]
        for n in ("cProfile", "VizTracer", "VizTracer ignore_c_function")
        if n in overhead
    ]
    report.target(
        "stepscope overhead / min(cProfile, VizTracer) overhead <= 0.8", ours / min(peers), 0.8
    )
    if "no-op C hook (floor)" in overhead:
        floor = overhead["no-op C hook (floor)"]
        report.target("stepscope overhead / no-op hook overhead <= 1.5", ours / floor, 1.5)
    _bytes_per_event(report)
    _none_step_cost(report, repeat=3 if report.quick else 5)
    extra = os.environ.get("STEPSCOPE_BENCH_PYTHONS", "")
    for python in [sys.executable, *(p for p in extra.split(os.pathsep) if p)]:
        _separate_processes(report, python)
