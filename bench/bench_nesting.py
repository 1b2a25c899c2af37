"""Span nesting (each span's parent and self time) on a 300k-event GPU trace, against HTA.

- stepscope ``nest_spans``: the C part (``_csrc/span_nesting.c``) and its pure-Python twin
  ``nest_spans_python``, on the trace read by stepscope.
- The peer: HTA's ``CallGraph`` (``hta.common.call_stack``: every event's parent and depth per
  thread and stream) on the same file as HTA parsed it.  Only the nesting is timed, not reading.
- ``analyze()`` of the same trace, for the nesting's share of the whole analysis.

Times are process CPU seconds (``time.process_time``), so other load on the machine counts less.
Issue 30 asks the whole ``stepscope report`` for <= 0.2x HTA's time (``bench_report.py``); this
is the nesting's part of it, with no target of its own.  The trace is ``training_rank0_gpu``
repeated (``bench_report.replicated_trace``) into a temporary directory.
"""

from __future__ import annotations

import gc
import logging
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from bench_report import replicated_trace
from harness import Report

EVENTS = 300_000


def cpu_seconds(fn: Callable[[], object], repeat: int) -> list[float]:
    """Process CPU seconds of ``repeat`` calls, each after a collection."""
    samples = []
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        fn()
        samples.append(time.process_time() - start)
    return samples


def run(report: Report) -> None:
    """C, twin and HTA on one trace; analyze() for scale."""
    from stepscope._ext import native
    from stepscope.analysis.analyze import analyze
    from stepscope.trace import read_chrome_trace
    from stepscope.trace.nesting import nest_spans, nest_spans_python

    repeat = 2 if report.quick else 5
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-nesting-") as tmp:
        path = Path(tmp) / "r300k_rank0.pt.trace.json"
        events = replicated_trace(EVENTS // 3 if report.quick else EVENTS, path)
        trace = read_chrome_trace(path)
        case = f"{events:,} events, {len(trace.spans):,} spans"
        report.note(f"trace: {case}; C extension in use: {native() is not None}")
        results = {}
        if native() is not None:
            results["c"] = report.add(
                case,
                "stepscope nest_spans (C)",
                "s CPU",
                cpu_seconds(lambda: nest_spans(trace), 2 * repeat),
            )
        results["twin"] = report.add(
            case,
            "stepscope nest_spans_python",
            "s CPU",
            cpu_seconds(lambda: nest_spans_python(trace), repeat),
        )
        logging.disable(logging.WARNING)
        warnings.simplefilter("ignore")
        from hta.common.call_stack import CallGraph
        from hta.common.trace import Trace as HtaTrace

        hta_trace = HtaTrace(trace_files={0: str(path)}, trace_dir=tmp)
        hta_trace.parse_traces()
        results["hta"] = report.add(
            case, "HTA CallGraph", "s CPU", cpu_seconds(lambda: CallGraph(hta_trace), repeat)
        )
        whole = report.add(
            case,
            "stepscope analyze()",
            "s CPU",
            cpu_seconds(lambda: analyze([("t", trace)]), repeat),
        )
    for subject in ("c", "twin"):
        if subject in results:
            report.ratio("nesting CPU, lower is better", results[subject], results["hta"])
    fast = results.get("c", results["twin"])
    report.note(f"nest_spans is {fast.median / whole.median:.1%} of analyze() ({fast.subject})")
