"""``stepscope report --markdown`` and ``stepscope.load_report`` in a real Jupyter kernel.

The runs are real profiled loops whose step bodies the test times and splits itself; the
Markdown's step count, median and forward share are checked against those, and the notebook's
outputs are checked as a Jupyter frontend receives them (nbclient driving ipykernel).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

import pytest

import stepscope
from stepscope.analysis.analyze import analyze
from stepscope.cli import main
from stepscope.report.markdown import escape
from stepscope.trace.chrome_reader import read_chrome_trace

pytestmark = pytest.mark.slow

RECORDED = 4
WAIT = 5  # unrecorded steps (the first is cold) enough for the overhead to be stated
HOSTILE = "evil | name <script>alert(1)</script> [link](http://x)"


def _profiled_loop(directory: Path, forward_s: float, idle_s: float) -> list[tuple[int, int]]:
    """Four recorded steps of a forward region and some idle time; the test's own (forward,
    step) times of each recorded step, in ns."""
    own: list[tuple[int, int]] = []
    sched = stepscope.schedule(wait=WAIT, warmup=1, active=RECORDED, repeat=1)
    with stepscope.profile(
        schedule=sched,
        on_trace_ready=stepscope.trace_handler(directory, worker_name="run"),
        torch_ops=False,
    ) as prof:
        for step in range(WAIT + 1 + RECORDED):
            began = time.perf_counter_ns()
            with stepscope.record_function("forward"):
                time.sleep(forward_s)
            forward = time.perf_counter_ns() - began
            with stepscope.record_function(HOSTILE):
                time.sleep(idle_s)
            if step >= WAIT + 1:
                own.append((forward, time.perf_counter_ns() - began))
            prof.step()
    return own


def test_the_markdown_summary_states_the_steps_and_their_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    own = _profiled_loop(tmp_path / "run", 0.006, 0.002)
    out = tmp_path / "summary.md"
    assert main(["report", str(tmp_path / "run"), "--markdown", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert f"**{RECORDED} steps**" in text
    median_ms = float(re.search(r"median ([\d.,]+) ms", text).group(1))  # type: ignore[union-attr]
    test_median = statistics.median(step for _, step in own) / 1e6
    assert median_ms == pytest.approx(test_median, rel=0.1)
    row = re.search(r"^\| forward \| [\d.,]+ \| ([\d.]+) \|$", text, re.M)
    assert row is not None, text
    test_share = 100 * sum(f for f, _ in own) / sum(s for _, s in own)
    assert abs(float(row.group(1)) - test_share) <= 3
    assert escape(HOSTILE) in text and "<script>" not in text  # no markup from a trace
    for line in text.splitlines():
        if line.startswith("| ") and "evil" in line:
            assert line.count(" | ") == 3  # the name's pipe did not add a column
    assert "Overhead: recorded steps took" in text
    assert "Markdown ->" in capsys.readouterr().err


def test_a_report_json_is_not_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _profiled_loop(tmp_path / "run", 0.001, 0.001)
    report = tmp_path / "report.json"
    assert main(["report", str(tmp_path / "run"), "--json", str(report)]) == 0
    capsys.readouterr()
    assert main(["report", str(report), "--markdown", str(tmp_path / "x.md")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("stepscope report: error:") and "\n" not in err
    assert not (tmp_path / "x.md").exists()


NOTEBOOK_CELLS = [
    "import stepscope\nr = stepscope.load_report({a!r})\nr",
    "b = stepscope.load_report({b!r})\nr.diff(b)",
    "print(r.to_json(indent=None))",
    "print(r.to_markdown())",
]


def test_load_report_displays_offline_in_a_real_kernel(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    _profiled_loop(tmp_path / "a", 0.002, 0.001)
    _profiled_loop(tmp_path / "b", 0.006, 0.001)
    cells = [c.format(a=str(tmp_path / "a"), b=str(tmp_path / "b")) for c in NOTEBOOK_CELLS]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    shown, diffed, as_json, as_md = (c.outputs for c in nb.cells)
    page = shown[0]["data"]["text/html"]
    assert page.startswith("<iframe srcdoc=") and "uPlot" in page and "d3" in page
    assert "Content-Security-Policy" in page and "default-src &#x27;none&#x27;" in page
    assert not re.search(r"(src|href)=\\?&quot;https?:", page)  # nothing fetched
    assert "text/markdown" in shown[0]["data"]  # frontends without HTML get the summary
    diff_md = diffed[0]["data"]["text/markdown"]
    a_trace = [(p.name, read_chrome_trace(p)) for p in sorted((tmp_path / "a").iterdir())]
    b_trace = [(p.name, read_chrome_trace(p)) for p in sorted((tmp_path / "b").iterdir())]
    a_med = analyze(a_trace).combined.step_stats.median_ns
    b_med = analyze(b_trace).combined.step_stats.median_ns
    assert f"({100 * (b_med - a_med) / a_med:+.1f}%)" in diff_md
    in_kernel = json.loads(as_json[0]["text"])
    here = json.loads(analyze(a_trace).to_json())
    assert in_kernel["combined"]["steps"] == here["combined"]["steps"]
    assert in_kernel["combined"]["overhead"]["recorded_steps"] == RECORDED
    assert as_md[0]["text"].startswith("### stepscope report")
