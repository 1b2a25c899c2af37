"""A window the target's exit cuts short: ``stepscope attach`` names the steps the trace holds
(through the step the process ended in), not the steps it asked for."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.steps import cut_short_steps, find_steps
from stepscope.commands.attach import _report
from stepscope.profiler.control_client import Session, hello
from stepscope.trace.chrome_reader import read_chrome_trace
from tests.attach_helpers import Target

pytestmark = pytest.mark.slow

ASKED = 1000
"""Steps asked for: far more than the target runs before it is stopped."""


def test_a_window_cut_short_by_exit_is_reported_as_the_steps_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = Target(tmp_path, "plain", "--step-on", "attach_target:train_step")
    path = target.listen_dir / f"{target.pid}.sock"
    answer: dict[str, Any] = {}
    try:
        session = Session(path, {"steps": ASKED, "out": str(tmp_path / "out")})
        waiting = threading.Thread(target=lambda: answer.update(session.wait(300, 60, print)))
        waiting.start()
        asked_at = int(hello(path)["step"])
        deadline = time.monotonic() + 120
        while int(hello(path)["step"]) < asked_at + 30 and time.monotonic() < deadline:
            time.sleep(0.05)  # the window runs some steps (by the target's own count)
        target.finish()
        waiting.join(timeout=120)
    finally:
        target.kill()
    assert answer.get("complete") is False, answer
    [trace_file] = answer["files"]
    trace = read_chrome_trace(trace_file)
    whole, _ = find_steps(trace)
    held = sorted({int(s.step) for s in [*whole, *cut_short_steps(trace)] if s.step is not None})
    first = answer["first_step"]
    assert held[0] == first and answer["last_step"] == held[-1] < first + ASKED - 1
    assert not _report(target.pid, answer)
    line = capsys.readouterr().out.strip()
    said = re.search(r": steps (\d+)-(\d+) \(the process ended inside step (\d+): partial", line)
    assert said is not None, line
    assert [int(g) for g in said.groups()] == [held[0], held[-1], held[-1]]
