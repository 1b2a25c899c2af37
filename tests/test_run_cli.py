"""``stepscope run``: a program run under the profiler, steps found on their own, traces written."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepscope.cli import main
from stepscope.commands.run import resolve_step_on
from stepscope.extras import torch_installed
from stepscope.trace import read_chrome_trace

pytestmark = pytest.mark.slow

PLAIN_SCRIPT = """
import sys
import stepscope
import helper

@stepscope.traced
def work(n):
    return sum(i * i for i in range(n))

for _ in range(8):
    helper.train_step(lambda: work(2000))
print("argv", sys.argv[1:])
if len(sys.argv) > 1 and sys.argv[1] == "fail":
    raise RuntimeError("the program failed")
if len(sys.argv) > 1 and sys.argv[1] == "exit":
    sys.exit(3)
"""

TORCH_SCRIPT = """
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
for _ in range(7):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture(autouse=True)
def fresh_helper_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test imports its own ``helper`` beside its script."""
    monkeypatch.delitem(sys.modules, "helper", raising=False)


def write_program(tmp_path: Path, text: str) -> Path:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(text))
    (tmp_path / "helper.py").write_text("def train_step(fn):\n    return fn()\n")
    return script


def traces(out: Path) -> list[Path]:
    return sorted(out.glob("*.pt.trace.json"))


def step_names(path: Path) -> list[str]:
    return sorted(s.name for s in read_chrome_trace(path).iter_spans() if s.name.startswith("Pro"))


def test_steps_end_on_each_return_of_a_function_beside_the_script(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = write_program(tmp_path, PLAIN_SCRIPT)
    out = tmp_path / "out"
    argv = ["run", "-o", str(out), "--step-on", "helper:train_step", str(script), "a", "b"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "argv ['a', 'b']" in captured.out
    [trace] = traces(out)
    # default schedule: wait 1, warmup 1, active 3, repeat 1
    assert step_names(trace) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    works = [s for s in read_chrome_trace(trace).iter_spans() if s.name == "__main__.work"]
    assert len(works) == 3
    assert "8 steps, 1 trace(s) written" in captured.err and str(trace) in captured.err
    assert "__main__.work" in captured.err  # the key_averages table


def test_step_on_none_records_the_whole_run_as_one_window(tmp_path: Path) -> None:
    script = write_program(tmp_path, PLAIN_SCRIPT)
    out = tmp_path / "out"
    assert main(["run", "-o", str(out), "--step-on", "none", "--top", "0", str(script)]) == 0
    [trace] = traces(out)
    works = [s for s in read_chrome_trace(trace).iter_spans() if s.name == "__main__.work"]
    assert len(works) == 8


def test_the_programs_exit_status_and_error_come_through_after_the_trace_is_saved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = write_program(tmp_path, PLAIN_SCRIPT)
    for arg, status, out_name in (("exit", 3, "a"), ("fail", 1, "b")):
        out = tmp_path / out_name
        argv = ["run", "-o", str(out), "--step-on", "none", str(script), arg]
        assert main(argv) == status
        assert len(traces(out)) == 1
    assert "RuntimeError: the program failed" in capsys.readouterr().err


def test_bad_invocations_say_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tmp_path / "missing.py")]) == 1
    assert "script not found" in capsys.readouterr().err
    assert main(["run"]) == 1
    assert "nothing to run" in capsys.readouterr().err
    assert main(["run", "-m", "no_such_module_here"]) == 1
    assert "no module named 'no_such_module_here'" in capsys.readouterr().err
    script = write_program(tmp_path, PLAIN_SCRIPT)
    assert main(["run", "--step-on", "train_step", str(script)]) == 1
    assert "expected 'optimizer', 'none' or 'module:qualname'" in capsys.readouterr().err
    assert main(["run", "--step-on", "helper:nope", str(script)]) == 1
    assert "'nope' not found" in capsys.readouterr().err
    assert main(["run", "--activities", "CPU,GPUZ", str(script)]) == 1
    assert "unknown profiler activity 'GPUZ'" in capsys.readouterr().err


def test_a_program_without_steps_is_told_how_to_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "nosteps.py"
    script.write_text("print('hello')\n")
    out = tmp_path / "out"
    assert main(["run", "-o", str(out), "--step-on", "helper:train_step", str(script)]) == 1
    assert "cannot import module 'helper'" in capsys.readouterr().err
    (tmp_path / "helper.py").write_text("def train_step():\n    pass\n")
    importlib.invalidate_caches()
    assert main(["run", "-o", str(out), "--step-on", "helper:train_step", str(script)]) == 0
    err = capsys.readouterr().err
    assert "nothing recorded" in err and "--step-on none" in err
    assert traces(out) == []


def test_the_default_step_is_the_optimizer_when_torch_is_installed() -> None:
    assert resolve_step_on("auto") == ("optimizer" if torch_installed() else None)
    assert resolve_step_on("none") is None
    assert resolve_step_on("pkg.mod:Cls.fn") == "pkg.mod:Cls.fn"


def test_console_command_runs_a_torch_loop_with_steps_from_the_optimizer(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = write_program(tmp_path, TORCH_SCRIPT)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "stepscope.cli", "run", "-o", str(out), "--record-shapes"]
    done = subprocess.run(
        [*command, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [trace] = traces(out)
    assert step_names(trace) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    spans = list(read_chrome_trace(trace).iter_spans())
    addmm = [s for s in spans if s.name == "aten::addmm"]
    assert len(addmm) == 3 * 2 and all(s.args and "Input Dims" in s.args for s in addmm)
    assert "7 steps, 1 trace(s) written" in done.stderr and "aten::addmm" in done.stderr


TIMED_SCRIPT = """
import json, sys, time
import helper

own = []  # the program's own clock: each train_step from its start to the next one's

def body():
    own.append(time.perf_counter_ns())
    deadline = time.perf_counter() + 0.003
    while time.perf_counter() < deadline:
        pass

for _ in range(40):
    helper.train_step(body)
own.append(time.perf_counter_ns())
json.dump([b - a for a, b in zip(own, own[1:])], open(sys.argv[1], "w"))
"""


def test_the_closing_line_states_the_overhead_over_the_whole_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first window's trace has too few unrecorded steps before it for a figure; the closing
    line states one over every warm unrecorded step of the run, its medians those of the
    program's own clock over the same steps."""
    import json
    import re
    import statistics

    script = write_program(tmp_path, TIMED_SCRIPT)
    out, own_file = tmp_path / "out", tmp_path / "own.json"
    argv = ["run", "-o", str(out), "--step-on", "helper:train_step", str(script), str(own_file)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    found = re.search(
        r"over the whole run: overhead: recorded steps took ([-+][0-9.]+)% against unrecorded "
        r"steps \(median ([0-9.]+) ms vs ([0-9.]+) ms; 3 recorded, ([0-9]+) warm unrecorded"
        r"(?: \(and ([0-9]+) cold first steps left out\))?, 1 warmup steps",
        err,
    )
    assert found is not None, err
    pct, recorded_ms, unrecorded_ms = (float(found[i]) for i in (1, 2, 3))
    warm, cold = int(found[4]), int(found[5] or 0)
    own = json.loads(own_file.read_text())  # steps 0..39: 0 waits, 1 warms up, 2-4 recorded
    assert warm + cold == len(own) - 3 - 1 == 36
    own_recorded = statistics.median(own[2:5]) / 1e6
    own_unrecorded = statistics.median(own[5:]) / 1e6  # (the first, cold one left out)
    # a step as stepscope times it ends where the next begins: the program's own clock, give or
    # take the hook's time at the edge (a scheduler slice on a loaded machine)
    assert recorded_ms == pytest.approx(own_recorded, rel=0.25, abs=1.0)
    assert unrecorded_ms == pytest.approx(own_unrecorded, rel=0.25, abs=1.0)
    assert pct == pytest.approx(100 * (recorded_ms / unrecorded_ms - 1), abs=0.2)
