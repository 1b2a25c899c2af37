"""The flame graphs' stacks the analysis hands the HTML report (``TraceSummary.flames``): the
host spans and samples of the analysed steps, checked against splits the tests compute from the
spans and samples they wrote, and against a step selection they make themselves on a real trace."""

from __future__ import annotations

import json
import re

import pytest

from stepscope.analysis.analyze import analyze
from stepscope.analysis.result import FlameStacks
from stepscope.report import html as report_html
from stepscope.trace.chrome_reader import read_chrome_trace
from stepscope.trace.model import Trace, TraceBuilder
from stepscope.trace.nesting import DEVICE_CATEGORIES
from stepscope.trace.stacks import span_stacks_ns
from tests.analysis_helpers import SHARED

STEP_NS, FORWARD_NS = 5_000, 3_000


def mm_ns(step: int) -> int:
    return 1_000 + 10 * step


def three_steps() -> Trace:
    """Steps 1-3 (``forward`` > ``aten::mm`` inside each), a host span between steps, a kernel
    inside each step, and samples inside, between and (idle) during the steps."""
    b = TraceBuilder(base_time_ns=0)
    hot = b.stack([b.frame("train", "/src/t.py"), b.frame("hot", "/src/t.py")])
    cold = b.stack([b.frame("train", "/src/t.py"), b.frame("cold", "/src/t.py")])
    for step in (1, 2, 3):
        t = 10_000 * step
        b.span(f"ProfilerStep#{step}", "user_annotation", 1, 1, t, STEP_NS)
        b.span("forward", "user_annotation", 1, 1, t + 100, FORWARD_NS)
        b.span("aten::mm", "cpu_op", 1, 1, t + 200, mm_ns(step))
        b.span("between", "user_annotation", 1, 1, t + STEP_NS + 500, 2_000)
        b.span("gemm_kernel", "kernel", 1, 7, t + 300, 900)
        for k in range(step):  # step N holds N busy samples of hot
            b.sample(1, 1, t + 400 + 10 * k, hot)
        b.sample(1, 1, t + 600, cold, idle=True)  # left out: idle
        b.sample(1, 1, t + STEP_NS + 600, cold)  # left out: between steps
    return b.build()


def test_stacks_are_the_analysed_steps_host_self_times() -> None:
    report = analyze([("t", three_steps())], step_range=(2, 3), flames=True)
    flames = report.combined.flames
    assert flames is not None
    chosen = (2, 3)
    assert flames.spans == {
        "ProfilerStep*": sum(STEP_NS - FORWARD_NS for _ in chosen),
        "ProfilerStep*;forward": sum(FORWARD_NS - mm_ns(s) for s in chosen),
        "ProfilerStep*;forward;aten::mm": sum(mm_ns(s) for s in chosen),
    }
    assert flames.samples == {"train (/src/t.py);hot (/src/t.py)": sum(chosen)}


def test_a_trace_without_steps_counts_every_host_span_and_busy_sample() -> None:
    b = TraceBuilder(base_time_ns=0)
    leaf = b.stack([b.frame("main", "/src/m.py")])
    b.span("outer", "user_annotation", 1, 1, 0, 1_000)
    b.span("inner", "user_annotation", 1, 1, 100, 300)
    b.span("later", "user_annotation", 1, 2, 5_000, 700)
    b.span("gemm_kernel", "kernel", 1, 7, 200, 900)
    for ts in (50, 5_100, 9_000):
        b.sample(1, 1, ts, leaf)
    b.sample(1, 1, 60, leaf, idle=True)
    flames = analyze([("t", b.build())], flames=True).combined.flames
    assert flames == FlameStacks(
        {"outer": 700, "outer;inner": 300, "later": 700}, {"main (/src/m.py)": 3}
    )


def test_several_files_are_summed_and_each_kept() -> None:
    trace = three_steps()
    report = analyze([("a", trace), ("b", trace)], flames=True)
    one = analyze([("a", trace)], flames=True).combined.flames
    assert one is not None
    assert [f.flames for f in report.files] == [one, one]
    assert report.combined.flames == FlameStacks(
        {k: 2 * v for k, v in one.spans.items()}, {k: 2 * v for k, v in one.samples.items()}
    )
    views = report_html.report_flames(report)
    assert len(views) == 3 and all({g["kind"] for g in v} == {"spans", "samples"} for v in views)


@pytest.mark.slow  # reads a big device trace
def test_real_trace_matches_a_step_selection_made_here() -> None:
    """training_rank0 (steps 101-105): steps 102-103 found from the raw spans by this test."""
    trace = read_chrome_trace(SHARED / "training_rank0_gpu.json.gz")
    spans, strings = trace.spans, trace.strings
    windows = [
        (spans["start_ns"][i], spans["start_ns"][i] + spans["dur_ns"][i])
        for i in range(len(spans))
        if (m := re.fullmatch(r"ProfilerStep#(\d+)", strings[spans["name"][i]]))
        and 102 <= int(m.group(1)) <= 103
        and strings[spans["cat"][i]] == "user_annotation"
    ]
    assert len(windows) == 2
    not_host = DEVICE_CATEGORIES | {"gpu_user_annotation", "cuda_profiler_range", "Trace"}

    def keep(i: int) -> bool:
        start = spans["start_ns"][i]
        return strings[spans["cat"][i]] not in not_host and any(
            lo <= start < hi for lo, hi in windows
        )

    expected = span_stacks_ns(trace, keep=keep)
    flames = analyze([("rank0", trace)], step_range=(102, 103), flames=True).combined.flames
    assert flames is not None and flames.samples == {}
    assert flames.spans == expected and sum(expected.values()) > 0


def test_stacks_stay_out_of_the_json_and_the_page_says_whether_it_had_them() -> None:
    trace = three_steps()
    with_flames = analyze([("t", trace)], flames=True)
    without = analyze([("t", trace)])
    assert with_flames.to_json() == without.to_json()
    assert "flames" not in json.loads(with_flames.to_json())["combined"]
    assert with_flames.cut(1).combined.flames == with_flames.combined.flames
    for report, given in ((with_flames, True), (without, False)):
        page = report_html.html_document(report)
        block = page.split('id="stepscope-data">\n', 1)[1].split("\n</script>", 1)[0]
        data = json.loads(block)
        assert data["generator"]["flames_given"] is given
        assert bool(data["views"][0]["flames"]) is given
