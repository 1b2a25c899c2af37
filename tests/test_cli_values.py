"""Numeric options of ``stepscope run`` and ``stepscope attach`` out of range: one line naming
the option, exit status 1, and nothing run or written, whatever the step source (a plain-Python
program builds no schedule, and its schedule options were once let through)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.cli import main

PROGRAM = """
from pathlib import Path
Path(__file__).with_name("ran").write_text("the program ran")
"""

RUN_VALUES = [
    ("--wait", "-1"),
    ("--warmup", "-2"),
    ("--active", "0"),
    ("--active", "-3"),
    ("--repeat", "-5"),
    ("--skip-first", "-1"),
    ("--max-calls", "0"),
    ("--max-depth", "-1"),
    ("--top", "-1"),
    ("--sampling-rate", "nan"),
    ("--sampling-rate", "inf"),
    ("--sampling-rate", "0"),
    ("--sampling-rate", "-3"),
    ("--sampling-rate", "1e9"),
]


@pytest.mark.parametrize("step_on", [None, "none"])
@pytest.mark.parametrize(("option", "value"), RUN_VALUES)
def test_run_refuses_an_out_of_range_value_before_the_program_runs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    option: str,
    value: str,
    step_on: str | None,
) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    out = tmp_path / "traces"
    argv = ["run", "-o", str(out), f"{option}={value}"]
    argv += ["--step-on", step_on] if step_on else []
    assert main([*argv, str(script)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"stepscope run: error: {option} must be "), err
    assert not (tmp_path / "ran").exists()
    assert not out.exists() or not any(out.iterdir())


ATTACH_VALUES = [
    ("--steps", "0"),
    ("--timeout", "inf"),
    ("--timeout", "nan"),
    ("--timeout", "1e300"),
    ("--timeout", "0"),
    ("--sample", "nan"),
    ("--sample", "inf"),
    ("--sample", "-1"),
    ("--sampling-rate", "nan"),
    ("--sampling-rate", "0"),
]


@pytest.mark.parametrize(("option", "value"), ATTACH_VALUES)
def test_attach_refuses_an_out_of_range_value_naming_it(
    capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    assert main(["attach", "999999999", f"{option}={value}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"stepscope attach: error: {option} must be "), err


def test_values_in_range_are_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    out = tmp_path / "traces"
    argv = ["run", "-o", str(out), "--step-on", "none", "--wait=0", "--repeat=0", "--top=0"]
    assert main([*argv, "--sampling-rate=100000", "--max-depth=0", str(script)]) == 0
    assert (tmp_path / "ran").exists()
    assert len(list(out.glob("*.pt.trace.json"))) == 1
