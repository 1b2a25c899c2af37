"""``stepscope attach``: real targets under ``stepscope run --on-demand``, attached to from outside.

Steps are checked against the target's own clock readings: it notes ``time.time_ns()`` around
every loop iteration, and each recorded ``ProfilerStep#k`` must begin in iteration k - 1 and end
in iteration k.  The target's output is recomputed by the test from its step count.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from stepscope.profiler.control_client import Session
from stepscope.profiler.control_protocol import ControlError
from stepscope.trace.chrome_reader import read_chrome_trace
from tests.attach_helpers import (
    ROOT,
    Target,
    assert_whole_steps,
    attach,
    child_env,
    output_line,
    traced_steps,
    wait_for,
)

pytestmark = pytest.mark.slow


def _attach_twice(
    target: Target, out: Path, steps: int, *second: str
) -> list[tuple[str, list[tuple[int, int, int]]]]:
    """Two attaches, one after the other (``second``: options of the second one)."""
    windows = []
    for options in ((), second):
        done = attach(str(target.pid), "--steps", str(steps), "-o", str(out), *options)
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.strip().splitlines()
        assert len(lines) == 1 and f"{target.pid}: steps " in lines[0], lines
        path = lines[0].rsplit(": ", 1)[1]
        windows.append((path, traced_steps(path)))
    return windows


def test_plain_loop_two_windows_of_whole_steps(tmp_path: Path) -> None:
    # a step is ~6 ms: at the default 100 Hz the twins' sampler thread may not tick in three,
    # and on a loaded machine its first tick came after three steps even at 1 kHz (eight: ~50 ms)
    target = Target(
        tmp_path, "plain", "--step-on", "attach_target:train_step", "--sampling-rate", "1000"
    )
    try:
        (sampled, first), (traced, second) = _attach_twice(
            target, tmp_path / "out", 8, "--with-stack"
        )
        out, err, times = target.finish()
    finally:
        target.kill()
    assert_whole_steps(first, times, 8)
    assert_whole_steps(second, times, 8)
    assert second[0][0] > first[-1][0]  # the second attach gets steps after the first window
    output_line(out)
    assert "2 on-demand trace(s)" in err
    samples = list(read_chrome_trace(sampled).iter_samples())  # CPU,SAMPLING by default here
    assert samples and {s.tid for s in samples} == {target.pid}  # no listener thread
    trace = read_chrome_trace(traced)
    names = [trace.strings[n] for n in trace.spans["name"]]
    # the program calls train_step once per step; the window ends where it returns
    assert sum(n.endswith(": train_step") for n in names) == 8, sorted(set(names))[:20]


def test_torch_loop_two_windows_with_ops(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    target = Target(tmp_path, "torch")
    try:
        windows = _attach_twice(target, tmp_path / "out", 2, "--memory")
        out, _, times = target.finish()
    finally:
        target.kill()
    for _, steps in windows:
        assert_whole_steps(steps, times, 2)
    assert windows[1][1][0][0] > windows[0][1][-1][0]
    output_line(out)
    for path, _ in windows:
        trace = read_chrome_trace(path)
        names = [trace.strings[n] for n in trace.spans["name"]]
        # one forward (aten::linear) and one optimizer step per step, two steps per window
        assert names.count("aten::linear") == 2, sorted(set(names))
        assert sum(n.startswith("Optimizer.step#SGD.step") for n in names) == 2
    memory = read_chrome_trace(windows[1][0])
    tracks = {memory.strings[n] for n in memory.counters["name"]}
    assert {"RSS", "Python heap"} <= tracks, tracks  # --memory reached the second window only
    plain = read_chrome_trace(windows[0][0])
    assert "RSS" not in {plain.strings[n] for n in plain.counters["name"]}


def test_environment_listener_plain_loop(tmp_path: Path) -> None:
    env = child_env(tmp_path / "ctl", STEPSCOPE_LISTEN="1", STEPSCOPE_STEP_ON="__main__:train_step")
    stop, times_file = tmp_path / "stop", tmp_path / "times.json"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "attach_target.py"), "listen", str(stop),
         str(times_file)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(tmp_path / "ctl" / f"{proc.pid}.sock", proc)
        done = attach(str(proc.pid), "--steps", "2", "-o", str(tmp_path / "out"))
        stop.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert done.returncode == 0, done.stderr
    assert proc.returncode == 0 and err == "", err  # the program's own output only
    times = [(a, b) for a, b in json.loads(times_file.read_text())]
    assert_whole_steps(traced_steps(done.stdout.strip().rsplit(": ", 1)[1]), times, 2)
    output_line(out)


def test_second_request_while_recording_is_refused(tmp_path: Path) -> None:
    target = Target(tmp_path, "plain", "--step-on", "attach_target:train_step")
    try:
        path = target.listen_dir / f"{target.pid}.sock"
        request = {"steps": 40, "out": str(tmp_path / "out")}
        first = Session(path, request)
        with pytest.raises(ControlError, match="already recording"):
            Session(path, request)
        for bad, says in (
            ({"steps": 5000}, "over the limit of 1000"),
            ({"activities": ["BOGUS"]}, "unknown profiler activity 'BOGUS'"),
            ({"out": "relative/dir"}, "must be an absolute path"),
        ):
            with pytest.raises(ControlError, match=says):
                Session(path, {**request, **bad})
        done = first.wait(120, 60, lambda text: None)
        assert len(done["files"]) == 1
        far = Session(path, {**request, "steps": 1, "start_step": 10**6})  # taken, waiting
        far.channel.conn.close()  # the client leaves: the program drops it at its next step
        deadline = time.monotonic() + 30
        while True:
            try:
                again = Session(path, {"steps": 1, "out": str(tmp_path / "out")})
                break
            except ControlError as exc:
                assert "already recording" in str(exc) and time.monotonic() < deadline
                time.sleep(0.05)
        assert len(again.wait(120, 60, lambda text: None)["files"]) == 1
        blocked = tmp_path / "a_file"
        blocked.write_text("")
        unwritable = Session(path, {"steps": 1, "out": str(blocked / "traces")})
        with pytest.raises(ControlError, match=r"could not write the trace to .*a_file/traces"):
            unwritable.wait(120, 60, lambda text: None)
        out, _, times = target.finish()
    finally:
        target.kill()
    assert_whole_steps(traced_steps(done["files"][0]), times, 40)
    output_line(out)


def test_process_without_stepscope_one_line_then_py_spy(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(
        "import time\n"
        "def spin_forever():\n"
        "    while True:\n"
        "        sum(i * i for i in range(10000))\n"
        "print('ready', flush=True)\n"
        "spin_forever()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=child_env(tmp_path)
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        done = attach(str(proc.pid), "--steps", "2", "-o", str(tmp_path / "out"))
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "is not attachable" in lines[0] and "--sample" in lines[0]
        sampled = attach(str(proc.pid), "--sample", "1", "-o", str(tmp_path / "out"))
        assert proc.poll() is None  # py-spy never stopped it
    finally:
        proc.kill()
        proc.communicate()
    if sampled.returncode != 0 and "py-spy" in sampled.stderr:
        pytest.skip(f"py-spy cannot sample here: {sampled.stderr.strip()}")
    assert sampled.returncode == 0, sampled.stderr
    path = sampled.stdout.strip().rsplit(": ", 1)[1]
    trace = read_chrome_trace(path)
    samples = list(trace.iter_samples())
    # the program does nothing but spin: nearly every sample of its main thread is in there
    inside = [any("spin_forever" in f for f in s.stack) for s in samples if s.stack]
    assert len(inside) >= 20 and sum(inside) >= 0.9 * len(inside), samples[:3]


def test_delayed_and_timed_out_request_is_withdrawn(tmp_path: Path) -> None:
    # the step source never fires (a function the loop never calls): nothing ever starts
    target = Target(tmp_path, "plain", "--step-on", "attach_target:main_never_called")
    try:
        done = attach(str(target.pid), "--steps", "2", "--timeout", "3")
        assert done.returncode == 1
        notice, final = done.stderr.strip().splitlines()
        assert "no step boundary for 1.5 s" in notice
        assert "timed out after 3 s" in final and "withdrawn" in final
        again = attach(str(target.pid), "--steps", "2", "--timeout", "2")  # not "already recording"
        assert "timed out" in again.stderr
        out, _, _ = target.finish()
    finally:
        target.kill()
    output_line(out)


def test_target_blocked_in_c_delays_the_window_and_the_client_says_so(tmp_path: Path) -> None:
    target = Target(tmp_path, "plain", "--step-on", "attach_target:train_step")
    try:
        target.block_file.touch()
        while target.block_file.exists():  # the target is now inside time.sleep(3.5)
            time.sleep(0.01)
        path = target.listen_dir / f"{target.pid}.sock"
        notices: list[str] = []
        done = Session(path, {"steps": 1, "out": str(tmp_path)}).wait(60, 1.0, notices.append)
        out, _, times = target.finish()
    finally:
        target.kill()
    assert len(notices) == 1 and "no step boundary for 1 s" in notices[0], notices
    steps = traced_steps(done["files"][0])
    assert_whole_steps(steps, times, 1)
    blocked = next(k for k, (start, end) in enumerate(times) if end - start > 3e9)
    assert steps[0][0] == blocked + 2  # the blocked step ended, one warm-up step, then the window
    output_line(out)


def test_process_exit_during_wait_is_told(tmp_path: Path) -> None:
    target = Target(tmp_path, "plain", "--step-on", "attach_target:main_never_called")
    try:
        path = target.listen_dir / f"{target.pid}.sock"
        session = Session(path, {"steps": 2, "out": str(tmp_path / "out")})
        target.stop_file.touch()
        with pytest.raises(ControlError, match="exited before the window started"):
            session.wait(60, 60, lambda text: None)
        target.finish()
    finally:
        target.kill()
    assert not path.exists()  # the listener removed its socket


def _nobody_python() -> str:
    """An interpreter user nobody can run: this one if it can, else the system's."""
    for python in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", python, "-c", "1"],
            capture_output=True,
        )
        if probe.returncode == 0:
            return python
    pytest.skip("no interpreter that user nobody can run")


def test_other_user_is_refused_and_target_unaffected(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to run a client as another user")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    python = _nobody_python()
    # A directory of its own under /tmp (pytest keeps re-closing its base directory to 0700),
    # opened so that nobody reaches the socket: the listener's SO_PEERCRED check must refuse.
    shared = Path(tempfile.mkdtemp(prefix="stepscope-attach-test-"))
    target = Target(
        tmp_path, "plain", "--step-on", "attach_target:train_step", listen_dir=shared / "ctl"
    )
    nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", python]
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": os.environ.get("PATH", "")}
    shared.chmod(0o755)
    target.listen_dir.chmod(0o755)
    (target.listen_dir / f"{target.pid}.sock").chmod(0o777)
    try:
        by_pid = subprocess.run(
            [*nobody, "-m", "stepscope", "attach", str(target.pid), "--steps", "1"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        by_socket = subprocess.run(
            [*nobody, "-m", "stepscope", "attach", "--job", str(target.listen_dir)],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        target.listen_dir.chmod(0o700)
        after = attach(str(target.pid), "--steps", "2", "-o", str(tmp_path / "out"))
        out, _, times = target.finish()
    finally:
        target.kill()
        shutil.rmtree(shared, ignore_errors=True)
    for done, says in ((by_pid, "belongs to another user"), (by_socket, "uid 65534 may not")):
        assert done.returncode == 1, done.stdout + done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], done.stderr
    assert after.returncode == 0, after.stderr
    assert_whole_steps(traced_steps(after.stdout.strip().rsplit(": ", 1)[1]), times, 2)
    output_line(out)


def test_stale_sockets_are_removed(tmp_path: Path) -> None:
    import socket

    listen_dir = tmp_path / "ctl"
    listen_dir.mkdir(mode=0o700)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    stale = listen_dir / f"{int(dead.stdout)}.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))
    target = Target(tmp_path, "plain", "--step-on", "attach_target:train_step")
    try:
        assert not stale.exists()
        wait_for(listen_dir / f"{target.pid}.sock", target.proc)
        target.finish()
    finally:
        target.kill()


def test_two_rank_job_records_the_same_steps_on_every_rank(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip(f"{torchrun} is not installed with torch here")
    from stepscope.trace.merge import rank_in_name
    from tests.metrics_fixtures import free_port

    listen_dir, stop = tmp_path / "ctl", tmp_path / "stop"
    job = subprocess.Popen(
        [
            str(torchrun), "--nproc-per-node=2", "--master-addr=127.0.0.1",
            f"--master-port={free_port()}", str(ROOT / "tests" / "attach_ranks_job.py"), str(stop),
        ],
        env=child_env(listen_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(list(listen_dir.glob("*.sock"))) < 2 and time.monotonic() < deadline:
            assert job.poll() is None, job.communicate()
            time.sleep(0.1)
        one_rank = sorted(listen_dir.glob("*.sock"))[0].name.split(".")[0]
        done = attach(one_rank, "--all-ranks", "--steps", "3", "-o", str(tmp_path / "out"))
        stop.touch()
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert done.returncode == 0, done.stdout + done.stderr
    assert job.returncode == 0, out[-2000:] + err[-2000:]
    files = [line.rsplit(": ", 1)[1] for line in done.stdout.strip().splitlines()]
    ranks = [rank_in_name(Path(f).name) for f in files]
    assert sorted(-1 if r is None else r for r in ranks) == [0, 1], files
    numbers = [[s for s, _, _ in traced_steps(f)] for f in files]
    assert numbers[0] == numbers[1] and len(numbers[0]) == 3, numbers
    assert numbers[0] == list(range(numbers[0][0], numbers[0][0] + 3))
    assert not list(listen_dir.glob("*.sock"))  # each rank removed its socket


def test_command_line_mistakes_are_one_line(tmp_path: Path) -> None:
    script = tmp_path / "x.py"
    script.write_text("print('ran')\n")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], **_TEXT)
    cases = [
        (["run", "--on-demand", "--step-on", "none", str(script)], "needs a step source"),
        (["attach"], "name the process"),
        (["attach", "--all-ranks"], "--all-ranks needs the PID"),
        (["attach", dead.stdout.strip()], f"there is no process {dead.stdout.strip()}"),
        (["attach", "1", "--steps", "0"], "--steps must be 1 or more"),
    ]
    env = child_env(tmp_path / "ctl")
    for args, says in cases:
        done = subprocess.run([sys.executable, "-m", "stepscope", *args], env=env, **_TEXT)
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1 and says in lines[0], (args, done.stderr)
        assert "ran" not in done.stdout


_TEXT: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 120}
