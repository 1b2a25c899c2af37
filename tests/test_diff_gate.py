"""``stepscope diff`` as a CI gate: the noise model, runs with nothing to compare, runs recorded
differently, renamed scripts, and rows that did not change."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import stepscope
from stepscope.analysis.diff import _row
from stepscope.analysis.noise import step_change
from stepscope.analysis.result import DiffRow
from stepscope.cli import main
from stepscope.commands.diff import EXIT_NO_STEPS
from stepscope.report.terminal import _change_pct
from tests.test_report_cli import record_loop, spin

ROOT = Path(__file__).resolve().parents[1]


def steps_like_a_busy_machine(seed: int, n: int, scale: float = 1.0) -> list[int]:
    """Step times of ~20 ms with a long right tail (lognormal, 10 % spread), in run order."""
    rng = random.Random(seed)
    return [int(20e6 * scale * rng.lognormvariate(0, 0.1)) for _ in range(n)]


def test_the_noise_model_holds_a_a_runs_and_finds_a_5_percent_shift() -> None:
    alarms = sum(
        step_change(
            steps_like_a_busy_machine(2 * k, 20), steps_like_a_busy_machine(2 * k + 1, 20)
        ).beyond_spread
        for k in range(200)
    )
    assert alarms <= 4  # 99 % interval, and the drift on top: ~1 % of A/A pairs or fewer
    a = [20_000_000 + 200_000 * (k % 5) for k in range(20)]  # 1 % spread, no drift
    b = [int(d * 1.05) for d in a]
    change = step_change(a, b)
    assert change.beyond_spread and change.low_ns > 0
    # the shift is the injected 5 % of the median step, measured independently here
    assert change.shift_ns == pytest.approx(0.05 * statistics.median(a), rel=0.1)
    assert not step_change(a[:2], b[:2]).known


def test_drift_within_a_run_widens_the_spread() -> None:
    steady = [20_000_000] * 20
    drifting = [20_000_000 + 300_000 * k for k in range(20)]  # slows down as it runs
    shifted = [int(d * 1.05) for d in steady]
    assert step_change(steady, shifted).beyond_spread
    # the same 1 ms shift is within what a drifting run does on its own (5.7 ms over 20 steps)
    change = step_change(drifting, [d + 1_000_000 for d in drifting])
    assert change.drift_ns > 1_000_000 and not change.beyond_spread


def test_gate_fails_with_its_own_status_when_a_run_has_no_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = record_loop(tmp_path / "a", steps=4, large_s=0.002)
    empty = tmp_path / "b"
    empty.mkdir()
    assert main(["diff", str(base), str(empty), "--fail-if-slower", "5"]) == EXIT_NO_STEPS
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "B (" in err and "no complete steps" in err
    # a trace without ProfilerStep spans (as a profile with no steps writes it)
    whole = tmp_path / "whole.json"
    event = {"ph": "X", "name": "work", "cat": "user_annotation", "pid": 1, "tid": 1}
    whole.write_text(json.dumps({"traceEvents": [{**event, "ts": 0, "dur": 2000}]}))
    assert main(["diff", str(whole), str(base), "--fail-if-slower"]) == EXIT_NO_STEPS
    err = capsys.readouterr().err.strip()
    assert err.startswith("stepscope diff: A (") and "no ProfilerStep spans" in err
    # without the gate the diff still prints
    assert main(["diff", str(base), str(base)]) == 0


def test_runs_recorded_differently_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = record_loop(tmp_path / "a", steps=4, large_s=0.002)
    other = tmp_path / "b"
    with stepscope.profile(
        record_shapes=True, on_trace_ready=stepscope.trace_handler(str(other))
    ) as prof:
        for _ in range(2):
            with stepscope.record_function("fn_large"):
                spin(0.002)
            prof.step()
    [trace] = other.glob("*.json")
    doc = json.loads(trace.read_text())
    doc["host_name"] = "another-machine"
    trace.write_text(json.dumps(doc))
    out = tmp_path / "d.json"
    capsys.readouterr()
    assert main(["diff", str(base), str(other), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    mismatches = json.loads(out.read_text())["mismatches"]
    assert any(m.startswith("activities differ") and "record_shapes" in m for m in mismatches)
    assert any(m.startswith("machine differ") and "another-machine" in m for m in mismatches)
    assert any(m.startswith("steps differ") for m in mismatches)
    assert "Not comparable: activities differ" in text


def test_categories_are_means_that_add_up_to_the_mean_step(tmp_path: Path) -> None:
    a = record_loop(tmp_path / "a", steps=5, large_s=0.003)
    b = record_loop(tmp_path / "b", steps=5, large_s=0.004)
    out = tmp_path / "d.json"
    assert main(["diff", str(a), str(b), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    for side in ("a", "b"):
        total = sum(c[f"{side}_ns"] for c in data["categories"])
        assert total == pytest.approx(data["step"][f"{side}_mean_ns"], rel=0.01)


def test_an_unchanged_tiny_row_says_same_not_a_percentage() -> None:
    row = _row("operator", "aten::view", 400.0, 940.0, 1_000_000)  # 0.0004 -> 0.0009 ms
    assert (row.status, _change_pct(row)) == ("same", "same")
    assert _change_pct(DiffRow("operator", "x", "slower", 1e6, 2e6, 1e6, 100.0, 1.0)) == "+100.0"


def test_a_renamed_script_keeps_its_functions(tmp_path: Path) -> None:
    body = (
        "def work(n):\n    s = 0\n    for i in range(n):\n        s += i * i\n    return s\n"
        "def step():\n    work(300000)\n"
        "for _ in range(6):\n    step()\n"
    )
    runs = []
    for name in ("train", "train_v2"):
        script = tmp_path / f"{name}.py"
        script.write_text(body)
        out = tmp_path / f"out_{name}"
        done = subprocess.run(
            [sys.executable, "-m", "stepscope", "run", "-o", str(out), "--top", "0",
             "--step-on", f"{name}:step", str(script)],
            capture_output=True, text=True, timeout=300,
            env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(out)
    out = tmp_path / "d.json"
    assert main(["diff", str(runs[0]), str(runs[1]), "--json", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["kind"] == "function"]
    work = [r for r in rows if r["name"].startswith("work (")]
    assert len(work) == 1, [r["name"] for r in rows]
    assert "train.py -> " in work[0]["name"] and "train_v2.py" in work[0]["name"]
    assert work[0]["status"] not in ("added", "removed")
    assert all(r["name"] for r in rows)
