"""``stepscope report`` on 100k-, 300k- and 1M-event GPU traces against HTA, and the Chrome
reader against JSON parsers.

Targets (issue 15):
- ``stepscope report`` on a >= 1M-event trace against HTA loading the same trace and computing
  its temporal breakdown, each in its own fresh process (wall time of the whole process, imports
  included; peak RSS of the process (its own ``VmHWM``) and anything it started): >= 5x faster,
  <= 0.3x the memory.
- the reader's events/s on the shared GPU traces (every phase, not only ``X``) against
  ``json.loads`` and ``orjson.loads`` of the same bytes (reported, no target).
Issue 30 asks for the first target at every size (100k, 300k and 1M events).
Target (issue 19): reading the 1M-event trace (every phase) at >= 2x ``orjson.loads`` of the
same bytes (reader seconds / orjson seconds <= 0.5).

The big trace is ``training_rank0_gpu.json.gz`` (from HTA's repository, in ../shared/traces)
repeated with shifted times, step numbers, correlation and flow ids, written to a temporary
directory (never into ../shared).
"""

from __future__ import annotations

import gc
import gzip
import importlib.util
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import Report, run_json_child

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "traces"
SOURCE = SHARED / "training_rank0_gpu.json.gz"
REPORT_SIZES = (100_000, 300_000, 1_000_000)
"""Events of the traces the report is compared with HTA on (issue 30: latency at every size)."""
GPU_TRACES = [
    "alexnet_gpu.json.gz",
    "amd_mi250_rocm.json.gz",
    "mtia_inference.json.gz",
    "nccl_gpu.json.gz",
    "training_rank0_gpu.json.gz",
    "triton_gpu.json.gz",
]
ID_STRIDE = 10_000_000
STEP_STRIDE = 1_000


def replicated_trace(target_events: int, out: Path) -> int:
    """Write ``SOURCE`` repeated until it holds ``target_events``; returns the event count."""
    doc = json.loads(gzip.decompress(SOURCE.read_bytes()))
    events: list[dict[str, Any]] = doc["traceEvents"]
    body = [e for e in events if e.get("ph") != "M"]
    times = [e["ts"] for e in body if "ts" in e]
    ends = [e["ts"] + e.get("dur", 0) for e in body if "ts" in e]
    shift = max(ends) - min(times) + 1_000.0  # µs between copies
    copies = -(-(target_events - (len(events) - len(body))) // len(body))
    out_events = [e for e in events if e.get("ph") == "M"]
    for k in range(copies):
        for e in body:
            c = dict(e)
            if "ts" in c:
                c["ts"] = c["ts"] + k * shift
            if "id" in c and isinstance(c["id"], int):
                c["id"] = c["id"] + k * ID_STRIDE
            name = c.get("name", "")
            if isinstance(name, str) and name.startswith("ProfilerStep#"):
                c["name"] = f"ProfilerStep#{int(name[13:]) + k * STEP_STRIDE}"
            args = c.get("args")
            if isinstance(args, dict) and ("correlation" in args or "External id" in args):
                args = dict(args)
                for key in ("correlation", "External id"):
                    if isinstance(args.get(key), int) and args[key] > 0:
                        args[key] += k * ID_STRIDE
                c["args"] = args
            out_events.append(c)
    doc["traceEvents"] = out_events
    try:
        import orjson

        out.write_bytes(orjson.dumps(doc))
    except ImportError:  # only slower
        out.write_text(json.dumps(doc, separators=(",", ":")))
    return len(out_events)


# ---- children ------------------------------------------------------------------------------


def child(kind: str, path: str, scratch: str) -> None:
    """Run one subject in this (fresh) process; print its in-process seconds and peak RSS."""
    start = time.perf_counter()
    phases: dict[str, float] = {}
    if kind.startswith("stepscope"):
        # what `stepscope report PATH --json F [--html H]` runs, phase by phase
        from rich.console import Console

        from stepscope.analysis.analyze import analyze
        from stepscope.atomic import write_text
        from stepscope.report.html import write_html
        from stepscope.report.terminal import render_report
        from stepscope.trace.loading import load_traces

        traces, _ = load_traces(Path(path), sys.stderr)
        phases["read"] = time.perf_counter() - start
        result = analyze(traces, flames=kind == "stepscope-html")
        phases["analyse"] = time.perf_counter() - start - phases["read"]
        with open(os.devnull, "w") as sink:
            render_report(result, Console(file=sink))
        write_text(os.path.join(scratch, "report.json"), result.to_json() + "\n", "JSON")
        if kind == "stepscope-html":
            write_html(result, os.path.join(scratch, "report.html"))
        phases["render and write"] = time.perf_counter() - start - sum(phases.values())
    else:
        import logging
        import warnings

        logging.disable(logging.WARNING)
        warnings.simplefilter("ignore")
        from hta.trace_analysis import TraceAnalysis

        analysis = TraceAnalysis(
            trace_files={0: path}, trace_dir=scratch, include_last_profiler_step=True
        )
        breakdown = analysis.get_temporal_breakdown(visualize=False)
        assert len(breakdown) == 1
    seconds = time.perf_counter() - start
    peak = max(own_peak_kb(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(u.ru_utime + u.ru_stime for u in used)  # the whole process, start-up included
    print(json.dumps({"seconds": seconds, "cpu": cpu, "maxrss_kb": peak, "phases": phases}))


def own_peak_kb() -> int:
    """This process's peak RSS in KiB: ``VmHWM`` of its own memory map where Linux gives it (the
    ``ru_maxrss`` of a process started with vfork/exec also counts its parent's peak)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_child(
    kind: str, path: Path, scratch: Path
) -> tuple[float, float, float, dict[str, float], float]:
    """(process wall seconds, in-process seconds, peak RSS MiB, phase seconds, process CPU
    seconds) of one run."""
    wall, found = run_json_child(
        [sys.executable, __file__, "--child", kind, str(path), str(scratch)],
        timeout=1800,
        cwd=str(HERE),
    )
    return wall, found["seconds"], found["maxrss_kb"] / 1024, found["phases"], found["cpu"]


# ---- the benchmark -------------------------------------------------------------------------


def bench_report_vs_hta(report: Report, work: Path, target_events: int) -> tuple[Path, int]:
    """stepscope report against HTA on ``SOURCE`` repeated to ``target_events``: (the trace,
    its events)."""
    big = work / f"replicated_{target_events}_rank0.pt.trace.json"
    start = time.perf_counter()
    events = replicated_trace(target_events, big)
    report.note(
        f"trace: {SOURCE.name} repeated to {events:,} events "
        f"({big.stat().st_size / 1e6:.0f} MB of .json), written in "
        f"{time.perf_counter() - start:.1f} s"
    )
    repeat = 1 if report.quick else 3
    case = f"report {events / 1e6:.2f}M-event trace"
    samples: dict[str, list[tuple[float, float, float, dict[str, float], float]]] = {}
    for _ in range(repeat):  # interleaved, so drift hits both alike
        for kind in ("stepscope", "hta", "stepscope-html"):
            if kind == "stepscope-html" and samples.get(kind) and report.quick:
                continue
            scratch = work / f"scratch-{kind}"
            scratch.mkdir(exist_ok=True)
            samples.setdefault(kind, []).append(run_child(kind, big, scratch))
    names = {
        "stepscope": "stepscope report --json",
        "hta": "HTA load + temporal breakdown",
        "stepscope-html": "stepscope report --json --html",
    }
    walls = {k: report.add(case, names[k], "s", [s[0] for s in v]) for k, v in samples.items()}
    for k, v in samples.items():
        report.add(case + " (in process)", names[k], "s", [s[1] for s in v])
    rss = {k: report.add(case, names[k], "MiB peak", [s[2] for s in v]) for k, v in samples.items()}
    cpu = {k: report.add(case, names[k], "CPU s", [s[4] for s in v]) for k, v in samples.items()}
    time_ratio = report.ratio("wall time, lower is better", walls["stepscope"], walls["hta"])
    cpu_ratio = report.ratio("CPU time, lower is better", cpu["stepscope"], cpu["hta"])
    mem_ratio = report.ratio("peak RSS, lower is better", rss["stepscope"], rss["hta"])
    report.note(f"stepscope report is {1 / time_ratio:.2f}x faster than HTA on this trace")
    for kind in ("stepscope", "stepscope-html"):
        runs = [s[3] for s in samples.get(kind, [])]
        if runs:
            split = ", ".join(
                f"{phase} {sorted(r[phase] for r in runs)[len(runs) // 2]:.1f} s"
                for phase in runs[0]
            )
            report.note(f"{names[kind]}, median per phase: {split}")
    size = f"{events / 1e3:,.0f}k events"
    report.target(f"{size}: stepscope report time / HTA time <= 0.2", time_ratio, 0.2)
    report.target(f"{size}: stepscope report CPU time / HTA CPU time <= 0.2", cpu_ratio, 0.2)
    report.target(f"{size}: stepscope report peak RSS / HTA peak RSS <= 0.3", mem_ratio, 0.3)
    return big, events


def bench_big_reader(report: Report, big: Path, events: int) -> None:
    """The reader on the 1M-event trace against orjson.loads and json.loads of its bytes."""
    import orjson

    from stepscope.trace.chrome_reader import read_chrome_trace

    repeat = 3 if report.quick else 5
    case = f"read {events / 1e6:.2f}M-event GPU trace"
    subjects = {
        "stepscope read_chrome_trace": lambda: read_chrome_trace(big),
        "orjson.loads": lambda: orjson.loads(big.read_bytes()),
        "json.loads": lambda: json.loads(big.read_bytes()),
    }
    samples: dict[str, list[float]] = {name: [] for name in subjects}
    for _ in range(repeat):  # interleaved, so drift hits all alike
        for name, fn in subjects.items():
            gc.collect()
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    timed = {name: report.add(case, name, "s", values) for name, values in samples.items()}
    for name, values in samples.items():
        report.add(case, name, "M events/s", [events / s / 1e6 for s in values])
    ratio = report.ratio(
        "read time, lower is better", timed["stepscope read_chrome_trace"], timed["orjson.loads"]
    )
    report.note(f"the reader is {1 / ratio:.2f}x orjson.loads on the same bytes (all phases)")
    report.target("reader seconds / orjson.loads seconds <= 0.5 (>= 2x)", ratio, 0.5)


def bench_reader(report: Report, work: Path) -> None:
    import orjson

    from stepscope.trace.chrome_reader import read_chrome_trace

    repeat = 3 if report.quick else 7
    totals = {"stepscope read_chrome_trace": 0.0, "json.loads": 0.0, "orjson.loads": 0.0}
    all_events = 0
    for name in GPU_TRACES:
        raw = gzip.decompress((SHARED / name).read_bytes())
        plain = work / name.removesuffix(".gz")
        plain.write_bytes(raw)
        events = len(json.loads(raw)["traceEvents"])
        all_events += events
        case = f"read {name.removesuffix('.json.gz')} ({events:,} events)"
        subjects = {
            "stepscope read_chrome_trace": lambda p=plain: read_chrome_trace(p),
            "json.loads": lambda p=plain: json.loads(p.read_bytes()),
            "orjson.loads": lambda p=plain: orjson.loads(p.read_bytes()),
        }
        for subject, fn in subjects.items():
            timed = report.measure(case, subject, fn, repeat=repeat, unit="s")
            totals[subject] += timed.median
            report.add(case, subject, "events/s", [events / s for s in timed.samples])
    rates = {k: all_events / v for k, v in totals.items()}
    report.note(
        f"all six shared GPU traces together ({all_events:,} events, every phase): "
        + ", ".join(f"{k} {v / 1e6:.3f} M events/s" for k, v in rates.items())
    )
    report.note(
        "reader / json.loads events/s: "
        f"{rates['stepscope read_chrome_trace'] / rates['json.loads']:.2f}; "
        f"reader / orjson.loads: {rates['stepscope read_chrome_trace'] / rates['orjson.loads']:.2f}"
    )


def run(report: Report) -> None:
    """Both parts, in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-report-") as tmp:
        work = Path(tmp)
        has_orjson = importlib.util.find_spec("orjson") is not None
        if has_orjson:
            bench_reader(report, work)
        else:
            report.note("orjson is not installed: the reader's comparison with it is left out")
        for target_events in REPORT_SIZES:
            big, events = bench_report_vs_hta(report, work, target_events)
            if has_orjson and target_events == REPORT_SIZES[-1]:
                bench_big_reader(report, big, events)
            big.unlink()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit("run through bench/run.py (python bench/run.py report)")
