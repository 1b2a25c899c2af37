"""``stepscope run`` on real programs: torch found late, script functions as steps, honest tables.

Each program runs in its own interpreter, as a user runs it, so that whether torch was imported
(and when) is the program's business, not the test process's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepscope.trace import read_chrome_trace

pytestmark = pytest.mark.slow

TORCH_INSIDE = """
import sys

def train():
    import torch  # only here: after stepscope's window has begun
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    for _ in range(5):
        one_step(torch, model, opt, x, y)

def one_step(torch, model, opt, x, y):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()

print("program ran", file=sys.stderr)
if __name__ == "__main__":
    train()
"""

PLAIN = """
import sys

class Trainer:
    def __init__(self):
        self.done = 0

    def step(self, n):
        total = 0
        for i in range(n):
            total += i * i
        self.done += 1
        return total

def hot(n):
    total = 0
    for i in range(n):
        total += i * i
    return total

def cold(n):
    total = 0
    for i in range(n):
        total += i * i
    return total

def train(rounds):
    for _ in range(rounds):
        hot(70_000)
        cold(30_000)

print("program ran", file=sys.stderr)
if __name__ == "__main__":
    trainer = Trainer()
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
        trainer.step(int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3].isdigit() else 2000)
    train(int(sys.argv[2]) if len(sys.argv) > 2 else 3)
    if "--fail" in sys.argv:
        def deeper():
            raise RuntimeError("the program failed")
        deeper()
"""


def stepscope_run(
    tmp_path: Path, script: str, *args: str, program_args: tuple[str, ...] = (), prelude: str = ""
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(script))
    code = prelude + "import sys\nfrom stepscope.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "run",
            "-o",
            str(tmp_path / "out"),
            *args,
            str(path),
            *program_args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        check=False,
    )


def trace_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "out").glob("*.pt.trace.json"))


def span_names(path: Path) -> list[str]:
    return [s.name for s in read_chrome_trace(path).iter_spans()]


def table_rows(stderr: str) -> list[list[str]]:
    """The data rows of the printed key_averages table, split into cells."""
    lines = stderr.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("-") and "  -" in line]
    body = lines[rules[1] + 1 : rules[2]]
    return [re.split(r"\s{2,}", line.strip()) for line in body]


def as_ns(cell: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", cell).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 1e3, "ms": 1e6, "s": 1e9}[unit]


@pytest.mark.parametrize("step_on", ["none", "prog:one_step"])
def test_torch_imported_inside_the_program_is_recorded(tmp_path: Path, step_on: str) -> None:
    pytest.importorskip("torch")
    done = stepscope_run(tmp_path, TORCH_INSIDE, "--step-on", step_on, "--wait", "0", "--top", "60")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("program ran") == 1
    names = [n for path in trace_files(tmp_path) for n in span_names(path)]
    assert names.count("aten::addmm") >= 2, sorted(set(names))
    if step_on != "none":  # a whole-run window's table is led by the sampled import of torch
        assert "aten::" in done.stderr


def test_a_profile_created_before_import_torch_records_torch_ops(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "api.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import stepscope
            assert "torch" not in sys.modules
            with stepscope.profile(step_on="optimizer") as prof:
                import torch
                model = torch.nn.Linear(4, 2)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                for _ in range(3):
                    model(torch.randn(3, 4)).sum().backward()
                    opt.step()
            names = [s.name for s in prof.events()]
            print(prof.step_num, names.count("aten::addmm"), names.count("aten::linear"))
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    steps, addmm, linear = map(int, done.stdout.split())
    assert steps == 3 and addmm == 3 and linear == 3


@pytest.mark.parametrize("step_on", ["prog:Trainer.step", "__main__:Trainer.step"])
def test_a_function_of_the_script_itself_ends_steps_and_the_program_runs_once(
    tmp_path: Path, step_on: str
) -> None:
    done = stepscope_run(tmp_path, PLAIN, "--step-on", step_on, "--activities", "CPU")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("program ran") == 1
    [trace] = trace_files(tmp_path)
    steps = sorted(n for n in span_names(trace) if n.startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert "6 steps, 1 trace(s) written" in done.stderr


def test_a_script_function_that_is_never_defined_is_named_in_the_hint(tmp_path: Path) -> None:
    done = stepscope_run(tmp_path, PLAIN, "--step-on", "prog:nothing_here")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("program ran") == 1
    assert "never defined nothing_here" in done.stderr


def test_the_table_is_sorted_by_self_time_and_says_which_window(tmp_path: Path) -> None:
    done = stepscope_run(
        tmp_path,
        PLAIN,
        "--step-on",
        "prog:Trainer.step",
        "--wait=0",
        "--warmup=1",
        "--active=2",
        "--repeat=2",
        "--with-stack",
        # 50,000 rounds a step (a few ms): with 2,000 a scheduler slice at a step boundary
        # once made the module's own time the top row (on the twins, beside another make test)
        program_args=("6", "0", "50000"),
    )
    assert done.returncode == 0, done.stderr
    assert len(trace_files(tmp_path)) == 2
    assert ", window 2 (steps 4-5) of 2" in done.stderr  # the name every report uses
    rows = table_rows(done.stderr)
    self_times = [as_ns(row[2]) for row in rows]
    assert self_times == sorted(self_times, reverse=True)
    assert rows[0][0].endswith("Trainer.step")

    done = stepscope_run(
        tmp_path, PLAIN, "--step-on", "none", "--with-stack", "--sort", "count", "--top", "2"
    )
    rows = table_rows(done.stderr)
    assert len(rows) == 2 and "top 2 by count" in done.stderr
    assert [int(row[-1]) for row in rows] == sorted((int(row[-1]) for row in rows), reverse=True)


def test_a_plain_program_shows_where_its_time_went_from_samples(tmp_path: Path) -> None:
    done = stepscope_run(
        tmp_path, PLAIN, "--step-on", "none", "--sampling-rate", "1000", program_args=("1", "25")
    )
    assert done.returncode == 0, done.stderr
    rows = {row[0].split(" ")[0]: row for row in table_rows(done.stderr)}
    hot, cold = rows["hot"], rows["cold"]
    assert hot[-1].startswith("~") and cold[-1].startswith("~")
    # hot does 70% of the loop's work and cold 30%: the sampled shares say the same
    hot_share = as_ns(hot[2]) / (as_ns(hot[2]) + as_ns(cold[2]))
    assert 0.6 < hot_share < 0.8, done.stderr
    total = as_ns(re.search(r"Self CPU time total: (\S+)", done.stderr).group(1))  # type: ignore[union-attr]
    assert sum(as_ns(row[2]) for row in rows.values()) == pytest.approx(total, rel=0.02)


def test_dropped_calls_are_said_not_hidden_in_self_time(tmp_path: Path) -> None:
    done = stepscope_run(tmp_path, PLAIN, "--step-on", "none", "--with-stack", "--max-calls", "50")
    assert done.returncode == 0, done.stderr
    assert "Note: the function tracer dropped" in done.stderr
    assert "--max-calls" in done.stderr


def test_torch_flags_without_torch_say_what_to_install(tmp_path: Path) -> None:
    block = "import sys\nsys.modules['torch'] = None  # as if torch were not installed\n"
    done = stepscope_run(tmp_path, PLAIN, "--record-shapes", prelude=block)
    assert done.returncode == 1
    assert "--record-shapes" in done.stderr and "pip install 'stepscope[torch]'" in done.stderr
    assert "program ran" not in done.stderr


def test_the_programs_traceback_starts_at_the_program(tmp_path: Path) -> None:
    done = stepscope_run(tmp_path, PLAIN, "--step-on", "none", program_args=("1", "0", "--fail"))
    assert done.returncode == 1
    tb = done.stderr[done.stderr.index("Traceback") : done.stderr.index("RuntimeError")]
    files = re.findall(r'File "([^"]+)"', tb)
    assert files and all(f.endswith("prog.py") for f in files), tb


def test_version_module_entry_point_and_plain_help() -> None:
    from stepscope import __version__

    version = subprocess.run(
        [sys.executable, "-m", "stepscope", "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == f"stepscope {__version__}"
    helptext = subprocess.run(
        [sys.executable, "-m", "stepscope", "run", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--step-on" in helptext and "``" not in helptext and ":func:" not in helptext


@pytest.mark.parametrize("flags", [("--sampling-rate", "1000"), ("--with-stack",)])
def test_no_frame_of_stepscope_or_its_launcher_reaches_the_results(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    console_script = Path(sys.executable).parent / "stepscope"
    if not console_script.exists():
        pytest.skip("the stepscope console script is not installed beside this interpreter")
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(PLAIN))
    done = subprocess.run(
        [
            *(str(console_script), "run", "-o", str(tmp_path / "out")),
            *("--step-on", "prog:Trainer.step", *flags, "--wait=0", str(path), "30", "4"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [trace_path] = trace_files(tmp_path)
    trace = read_chrome_trace(trace_path)
    frames = trace.tables["frames"]
    files = {trace.strings[f] for f in frames["file"]}
    names = {trace.strings[n] for n in trace.spans["name"]}

    def own(text: str) -> bool:
        return "stepscope/" in text or "bin/stepscope" in text or "runpy" in text

    assert not [f for f in files if own(f)], files
    assert not [n for n in names if own(n) or n.startswith("stepscope(")], names
    rows = [row[0] for row in table_rows(done.stderr)]
    assert not [r for r in rows if own(r) or "(stepscope" in r], rows
