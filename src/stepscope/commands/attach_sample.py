"""``stepscope attach PID --sample SECONDS``: py-spy samples a process that has no stepscope in it.

py-spy reads the process from outside (ptrace, ``--nonblocking``: the process is never paused);
its speedscope file is kept and also written as a Chrome trace of samples (no steps), which
``stepscope report`` reads.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from stepscope import clock
from stepscope.atomic import make_directory
from stepscope.profiler.control_protocol import ControlError
from stepscope.sampling.pyspy import find_py_spy, read_py_spy_speedscope
from stepscope.sampling.session import BackendUnavailable, FunctionProfilerError
from stepscope.trace.chrome_writer import write_chrome_trace

__all__ = ["sample_process"]


def sample_process(pid: int, seconds: float, rate_hz: float, out: Path) -> Path:
    """Sample ``pid`` for ``seconds`` with py-spy; returns the Chrome trace written into ``out``."""
    try:
        executable = find_py_spy("py-spy")
    except BackendUnavailable as exc:
        raise ControlError(f"--sample needs py-spy: {exc}") from None
    make_directory(out, "stepscope attach", "output directory")
    stamp = clock.to_unix_ns(clock.now_ns())
    stem = out / f"{socket.gethostname()}_{pid}.{stamp}"
    speedscope = stem.with_name(stem.name + ".speedscope.json")
    command = [
        executable, "record", "--pid", str(pid), "--rate", str(max(1, round(rate_hz))),
        "--duration", str(max(1, round(seconds))), "--format", "speedscope",
        "--output", str(speedscope), "--threads", "--idle", "--full-filenames", "--nonblocking",
    ]  # fmt: skip
    start_ns = clock.now_ns()
    done = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=seconds + 60
    )
    if done.returncode != 0 or not speedscope.exists():
        lines = (done.stderr or done.stdout).strip().splitlines()
        why = lines[-1] if lines else f"exit code {done.returncode}"
        raise ControlError(f"py-spy could not sample process {pid}: {why}")
    try:
        trace = read_py_spy_speedscope(speedscope, start_ns, rate_hz)
    except FunctionProfilerError as exc:
        raise ControlError(str(exc)) from None
    chrome = stem.with_name(stem.name + ".pt.trace.json")
    write_chrome_trace(trace, chrome)
    return chrome
