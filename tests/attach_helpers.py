"""Shared by the attach tests: start an attachable target, run ``stepscope attach``, read steps."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stepscope.analysis.steps import find_steps
from stepscope.trace.chrome_reader import read_chrome_trace

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "tests" / "attach_target.py"
CLOCK_TOLERANCE_NS = 2_000_000
"""time.time_ns() against stepscope's monotonic-plus-wall-base clock, with scheduling slack."""


def child_env(listen_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a child: this tree first on the path, its own listener directory."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "STEPSCOPE_LISTEN_DIR": str(listen_dir),
        **extra,
    }


def wait_for(path: Path, proc: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    """Wait until ``path`` exists; fail with the process's output if it exits first."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the target exited ({proc.returncode}) first:\n{out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.05)


class Target:
    """``stepscope run --on-demand`` of tests/attach_target.py, stopped by a stop file."""

    def __init__(
        self, tmp: Path, mode: str, *run_options: str, listen_dir: Path | None = None
    ) -> None:
        self.listen_dir = listen_dir or tmp / "ctl"
        self.stop_file = tmp / "stop"
        self.block_file = tmp / "block"
        """Touch it to block the next plain step in C code (time.sleep) for 3.5 s."""
        self.times_file = tmp / "times.json"
        command = [sys.executable, "-m", "stepscope", "run", "--on-demand", *run_options]
        command += [str(TARGET), mode, str(self.stop_file), str(self.times_file)]
        self.proc = subprocess.Popen(
            command,
            env=child_env(self.listen_dir, ATTACH_TARGET_BLOCK=str(self.block_file)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid
        wait_for(self.listen_dir / f"{self.pid}.sock", self.proc)

    def finish(self) -> tuple[str, str, list[tuple[int, int]]]:
        """Stop the loop; (stdout, stderr, each step's (start, end) time.time_ns())."""
        self.stop_file.touch()
        out, err = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, out + err
        import json

        return out, err, [tuple(t) for t in json.loads(self.times_file.read_text())]

    def kill(self) -> None:
        """Make sure the target is gone."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def attach(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``stepscope attach ARGS`` in a child."""
    return subprocess.run(
        [sys.executable, "-m", "stepscope", "attach", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env or {**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )


def traced_steps(path: str | Path) -> list[tuple[int, int, int]]:
    """(step, start, end) of a trace's ProfilerStep spans, times in Unix ns."""
    trace = read_chrome_trace(path)
    found, _ = find_steps(trace)
    base = trace.base_time_ns
    return sorted(
        (int(s.step), base + s.start_ns, base + s.end_ns) for s in found if s.step is not None
    )


def assert_whole_steps(
    steps: list[tuple[int, int, int]], times: list[tuple[int, int]], count: int
) -> None:
    """``count`` consecutive steps, each begun in the loop's iteration before and ended in its own.

    ``times[k]`` is iteration k as the program measured it; step k ends inside iteration k (at
    ``train_step``'s return or the optimizer step) and begins inside iteration k - 1.
    """
    numbers = [s for s, _, _ in steps]
    assert len(numbers) == count, steps
    assert numbers == list(range(numbers[0], numbers[0] + count)), numbers
    tol = CLOCK_TOLERANCE_NS
    for step, start, end in steps:
        before, own = times[step - 1], times[step]
        assert before[0] - tol <= start <= before[1] + tol, (step, start, before)
        assert own[0] - tol <= end <= own[1] + tol, (step, end, own)


def output_line(stdout: str) -> dict[str, Any]:
    """The target's last line, checked against what its loop computes for that many steps."""
    line = stdout.strip().splitlines()[-1]
    count = int(line.split()[0])
    total = sum(sum(k * k for k in range(2000)) + i for i in range(count))
    assert line == f"{count} steps, total {total}", line
    return {"steps": count}
