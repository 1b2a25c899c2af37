"""Windows that end inside a torch ``record_function`` block (issue 37, point 1).

With ``step_on="optimizer"`` a window ends in the optimizer's step post-hook, inside torch's
``Optimizer.step#...`` block; when the next window's torch session started there, torch wrote that
block's end into the stopped session's freed event buffer, and ``profile_memory=True`` loops died
with SIGSEGV at a later window end (2 of 6 runs in the issue; here every process of 20 profiles).
The torch collector now starts the next session only once such blocks have exited
(``collectors/open_blocks.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stepscope  # noqa: E402
from stepscope.collectors.torch import OPEN_BLOCKS_KEY  # noqa: E402

MIB = 1 << 20
pytestmark = pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")

LOOP = textwrap.dedent(
    """
    import faulthandler
    import json
    import sys

    faulthandler.enable()

    import torch

    import stepscope
    from stepscope.trace.memory_fields import MEMORY_INSTANT, MEMORY_KEY, tensor_events

    MIB = 1 << 20


    def report(prof):
        trace = prof._traces[-1]
        instants = trace.instants
        names = instants["name"]
        wanted = trace.strings.index(MEMORY_INSTANT) if MEMORY_INSTANT in trace.strings else -1
        found = [
            (instants["ts_ns"][i], instants["pid"][i], instants["tid"][i],
             trace.args_at(instants["args"][i]))
            for i in range(len(instants))
            if names[i] == wanted
        ]
        rows = trace.metadata[MEMORY_KEY]["steps"]
        print(json.dumps({
            "steps": [row["step"] for row in rows],
            "python_current": [row.get("python_current") for row in rows],
            "tensor_mib_allocs": sum(1 for e in tensor_events(found) if e.bytes == MIB),
            "torch_events": trace.metadata.get("stepscope_torch_events"),
            "note": trace.metadata.get("stepscope_torch_open_blocks"),
        }), flush=True)


    def run_once():
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        kept = []
        schedule = stepscope.schedule(wait=0, warmup=0, active=2)
        with stepscope.profile(
            profile_memory=True, schedule=schedule, step_on="optimizer", on_trace_ready=report
        ):
            for _ in range(5):
                kept.append((bytearray(MIB), torch.empty(MIB // 4)))  # 1 MiB each, kept
                opt.zero_grad()
                model(torch.randn(8, 4)).sum().backward()
                opt.step()


    for _ in range(int(sys.argv[1])):
        run_once()
    """
)


def _run_loop(script: Path, implementation: str, profiles: int) -> list[dict[str, Any]]:
    env = {**os.environ, "STEPSCOPE_IMPLEMENTATION": implementation}
    done = subprocess.run(
        [sys.executable, str(script), str(profiles)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    windows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(windows) == 3 * profiles  # steps 0-1, 2-3, then 4 cut short by the exit
    return windows


def _check_window(window: dict[str, Any]) -> None:
    """Every window recorded torch, and the memory the loop kept: 1 MiB of Python bytes and one
    1 MiB tensor per step."""
    assert window["note"] is None
    assert window["torch_events"] > 50
    current = window["python_current"]
    assert 0.9 * MIB <= current[0] <= 1.4 * MIB  # the window's first step kept 1 MiB
    if window["steps"][0] == 4:  # the last window: step 4, then the exit's empty step 5
        assert window["tensor_mib_allocs"] == 1
        assert abs(current[1] - current[0]) < 0.1 * MIB
    else:
        assert window["tensor_mib_allocs"] == 2
        assert 0.9 * MIB <= current[1] - current[0] <= 1.2 * MIB


@pytest.mark.implementation_independent
@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["native", "python"])
def test_profile_memory_windows_ending_in_the_optimizer_hook_never_crash(
    tmp_path: Path, implementation: str
) -> None:
    """The issue's loop, 20 profiles in one process (60 window ends, 40 of them with the next
    window starting in the same optimizer hook), then in 4 fresh processes of 2 profiles:
    exit 0 every time, with the Python heap and tensor allocations the loop made."""
    if implementation == "native":
        from stepscope import _ext

        if _ext.native() is None:
            pytest.skip(f"the C extension is not in use: {_ext.load_error}")
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    windows = _run_loop(script, implementation, 20)
    for _ in range(4):
        windows += _run_loop(script, implementation, 2)
    for window in windows:
        _check_window(window)


# -- in this process: the next session waits for the blocks, and the watch goes away -------------
def _loop(prof_kwargs: dict[str, Any], steps: int = 7, scope: bool = False) -> list[Any]:
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[Any] = []

    def ready(prof: Any) -> None:
        meta = prof._traces[-1].metadata
        seen.append((meta.get("stepscope_torch_events"), meta.get(OPEN_BLOCKS_KEY)))

    schedule = stepscope.schedule(wait=0, warmup=0, active=2)
    with stepscope.profile(
        schedule=schedule, step_on="optimizer", on_trace_ready=ready, **prof_kwargs
    ):
        for _ in range(steps):
            if scope:
                with torch.profiler.record_function("train_step"):
                    opt.zero_grad()
                    model(torch.randn(8, 4)).sum().backward()
                    opt.step()
            else:
                opt.zero_grad()
                model(torch.randn(8, 4)).sum().backward()
                opt.step()
    return seen


@pytest.mark.parametrize("scope", [False, True], ids=["optimizer_block", "and_a_user_block"])
@pytest.mark.parametrize("with_stack", [False, True])
def test_the_next_session_starts_when_the_open_blocks_have_exited(
    scope: bool, with_stack: bool
) -> None:
    """Back-to-back windows all record torch in full, the block left open by each (torch's
    Optimizer.step, the program's own block around the step) is waited for, and the watch's
    profile function is gone afterwards (under stepscope's tracer too, which chains it)."""
    assert sys.getprofile() is None
    seen = _loop({"profile_memory": True, "with_stack": with_stack}, scope=scope)
    assert sys.getprofile() is None
    assert len(seen) == 4
    for torch_events, note in seen:
        assert note is None
        assert torch_events > 50 or torch_events == seen[-1][0]  # the last: one short step
    assert seen[-1][0] > 0


def test_with_another_profile_function_the_session_waits_for_the_next_step() -> None:
    """A profile function of the program's own keeps its place; torch's Optimizer.step block
    has ended by the next step, so each later window's session starts there (and says so)."""

    def programs_own(frame: Any, event: str, arg: Any) -> None:
        return None

    sys.setprofile(programs_own)
    try:
        seen = _loop({"profile_memory": True})
        assert sys.getprofile() is programs_own
    finally:
        sys.setprofile(None)
    assert seen[0][0] > 50 and seen[0][1] is None
    for torch_events, note in seen[1:]:
        assert torch_events > 0
        assert note.startswith("torch's profiler started at step")


def test_with_another_profile_function_an_unseen_block_holds_torch_back() -> None:
    """A block of the program's own that no watch could see end: later windows record without
    torch (never a session that torch would corrupt) and say why, in the trace and summary."""

    def programs_own(frame: Any, event: str, arg: Any) -> None:
        return None

    sys.setprofile(programs_own)
    try:
        seen = _loop({}, scope=True)
        assert sys.getprofile() is programs_own
    finally:
        sys.setprofile(None)
    assert seen[0][0] > 50 and seen[0][1] is None
    for torch_events, note in seen[1:]:
        assert torch_events is None
        assert "train_step" in note and "not started in this window" in note
