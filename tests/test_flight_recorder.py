"""The flight recorder (issue 40): the last N steps always kept, dumped as an ordinary trace on a
slow step, an exception, a hang, SIGUSR1 or ``stepscope attach --dump``; the program's own
output, exit status, exception and signal handlers unchanged."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.collectors.sampler import make_backend
from stepscope.failures import failure_counts
from stepscope.profiler.control_client import find_listener, request_dump
from stepscope.profiler.control_protocol import ControlError
from stepscope.profiler.flight_recorder import active_flight
from stepscope.trace.chrome_reader import read_chrome_trace
from stepscope.trace.model import Trace

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / "tests" / "flight_programs.py"
OPEN_FLAG = "stepscope.open_at_window_end"


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _recorder(out: Path, **options: Any) -> stepscope.FlightRecorder:
    settings: dict[str, Any] = {"steps": 8, "out": str(out), "hang_s": 0, "attachable": False}
    settings.update(options)
    return stepscope.FlightRecorder(**settings)


def _dumps(out: Path, reason: str) -> list[Path]:
    return sorted(out.glob(f"*.flight-{reason}-*.pt.trace.json"))


def _steps(trace: Trace) -> dict[int, tuple[int, int, bool]]:
    """``ProfilerStep#N`` spans: N -> (start, duration, open at the dump)."""
    found = {}
    for span in trace.iter_spans():
        if span.name.startswith("ProfilerStep#"):
            args = span.args or {}
            found[int(span.name.split("#")[1])] = (span.start_ns, span.dur_ns, OPEN_FLAG in args)
    return found


def _child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), **extra}


def test_a_slow_step_dumps_itself_and_the_n_steps_before_it(tmp_path: Path) -> None:
    out = tmp_path / "flight"
    own: dict[int, int] = {}  # the loop's own clock of each step body
    recorder = _recorder(out, min_steps_between=1, max_dumps=100, slow_min_s=0.15)
    with stepscope.profile(flight_recorder=recorder) as prof:
        for step in range(40):
            began = time.perf_counter_ns()
            with stepscope.record_function("forward"):
                _spin(0.002)
            if step == 30:
                time.sleep(0.3)
            own[step] = time.perf_counter_ns() - began
            prof.step()
    dumps = [p for p in _dumps(out, "slow_step") if "-step30." in p.name]
    assert len(dumps) == 1, sorted(p.name for p in out.iterdir())
    trace = read_chrome_trace(dumps[0])
    steps = _steps(trace)
    assert sorted(steps) == list(range(22, 31))  # the bad step and the 8 before it
    assert not any(open_ for _, _, open_ in steps.values())
    for step, (_, duration, _) in steps.items():  # the dump's step times against the loop's
        # the dump's step also holds the few bytecodes around the loop's own clock reads (and
        # any preemption there, on a loaded host)
        assert own[step] <= duration <= own[step] + 20_000_000, step
    flight = trace.metadata["stepscope_flight"]
    assert flight["reason"] == "slow_step" and flight["step"] == 30
    assert flight["median_step_ns"] < 0.1e9 < 0.3e9 < steps[30][1]
    forwards = [s for s in trace.iter_spans() if s.name == "forward"]
    assert len(forwards) == 9  # one per kept step, each inside its step
    start, duration, _ = steps[30]
    in_slow = [s for s in trace.iter_samples() if start <= s.ts_ns <= start + duration]
    assert len(in_slow) >= 5  # ~30 at 100 Hz over the 0.3 s sleep
    assert any("test_a_slow_step" in " ".join(s.stack) for s in in_slow)
    assert prof.flight is not None and str(dumps[0]) in prof.flight.dumps


def test_an_exception_dumps_the_open_step_and_reaches_the_program_unchanged(
    tmp_path: Path,
) -> None:
    out = tmp_path / "flight"
    raised = ValueError("bad batch")
    with (
        pytest.raises(ValueError) as caught,
        stepscope.profile(flight_recorder=_recorder(out, steps=5)) as prof,
    ):
        for step in range(50):
            with stepscope.record_function("forward"):
                _spin(0.001)
            if step == 20:
                raise raised
            prof.step()
    assert caught.value is raised
    (dump,) = _dumps(out, "exception")
    trace = read_chrome_trace(dump)
    steps = _steps(trace)
    assert sorted(steps) == list(range(15, 21))
    assert steps[20][2] and not any(steps[s][2] for s in range(15, 20))
    flight = trace.metadata["stepscope_flight"]
    assert flight["reason"] == "exception" and flight["detail"] == "ValueError: bad batch"
    assert "raise raised" in flight["traceback"]
    assert sum(1 for s in trace.iter_spans() if s.name == "forward") == 6  # the open step's too
    assert active_flight() is None


def test_sigusr1_dumps_and_the_programs_own_handler_still_runs_and_is_put_back(
    tmp_path: Path,
) -> None:
    out = tmp_path / "flight"
    received: list[int] = []

    def own(signum: int, frame: object) -> None:
        received.append(signum)

    previous = signal.signal(signal.SIGUSR1, own)
    try:
        with stepscope.profile(flight_recorder=_recorder(out, steps=4)) as prof:
            for step in range(2500):  # the recorder's thread looks every 0.25 s
                _spin(0.002)
                if step == 10:
                    os.kill(os.getpid(), signal.SIGUSR1)
                if step > 10 and _dumps(out, "signal"):
                    break
                prof.step()
        assert received == [signal.SIGUSR1]
        assert signal.getsignal(signal.SIGUSR1) is own
        (dump,) = _dumps(out, "signal")
        flight = read_chrome_trace(dump).metadata["stepscope_flight"]
        assert flight["reason"] == "signal"
        main = flight["stacks"][str(threading.get_native_id())]
        assert main["name"] == "MainThread"
        assert any("test_sigusr1_dumps" in frame for frame in main["frames"])
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_attach_dump_writes_the_ring_and_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEPSCOPE_LISTEN_DIR", str(tmp_path / "ctl"))
    out = tmp_path / "flight"
    recorder = _recorder(out, steps=3, attachable=True)
    answers: list[dict[str, Any]] = []
    with stepscope.profile(flight_recorder=recorder) as prof:
        path = find_listener(os.getpid())
        asking = threading.Thread(target=lambda: answers.append(request_dump(path, 30)))
        deadline = time.monotonic() + 60
        step = 0
        while not answers and time.monotonic() < deadline:
            _spin(0.001)
            if step == 5:
                asking.start()
            step += 1
            prof.step()
        asking.join(30)
    assert answers, "no answer from the listener"
    (written,) = answers[0]["files"]
    trace = read_chrome_trace(written)
    assert trace.metadata["stepscope_flight"]["reason"] == "attach"
    assert len(_steps(trace)) == 4  # three before the open step, and it
    with pytest.raises(ControlError, match="is gone"):
        request_dump(path, 5)  # the listener went with the profile


def test_a_trigger_arms_one_full_window_of_the_profiles_options(tmp_path: Path) -> None:
    out = tmp_path / "flight"
    recorder = _recorder(out, steps=4, window_steps=3, slow_min_s=0.15)
    with stepscope.profile(
        flight_recorder=recorder,
        activities=["CPU", "SAMPLING"],
        sampling_rate_hz=1000,  # the window's own rate
        torch_ops=False,
    ) as prof:
        for step in range(40):
            with stepscope.record_function("forward"):
                _spin(0.01)
            if step == 20:
                time.sleep(0.25)
            prof.step()
    # the first trigger arms the window: step 20's, unless a stall of the host came first
    (window,) = out.glob("*.flight-window-slow_step-step*.pt.trace.json")
    trace = read_chrome_trace(window)
    armed = trace.metadata["stepscope_flight_window"]
    assert armed["reason"] == "slow_step" and armed["trigger_step"] <= 20
    first = armed["trigger_step"] + 2  # warm-up on the next step, then three recorded
    assert sorted(_steps(trace)) == [first, first + 1, first + 2]
    assert trace.metadata["stepscope_sampler"]["samples"] > 0
    assert sum(1 for s in trace.iter_spans() if s.name == "forward") == 3
    assert _dumps(out, "slow_step")  # the ring itself too


def test_scheduled_windows_and_the_ring_take_turns(tmp_path: Path) -> None:
    out = tmp_path / "flight"
    written: list[Trace] = []
    schedule = stepscope.schedule(wait=5, warmup=1, active=3, repeat=1)
    with stepscope.profile(
        flight_recorder=_recorder(out, steps=20),
        schedule=schedule,
        on_trace_ready=lambda p: written.append(p.trace()),
        torch_ops=False,
    ) as prof:
        for step in range(16):
            with stepscope.record_function("forward"):
                _spin(0.001)
            if step == 15:
                assert prof.flight is not None
                path = prof.flight.dump_now()
            prof.step()
    (window,) = written
    assert sum(1 for s in window.iter_spans() if s.name == "forward") == 3
    ring = read_chrome_trace(path)
    assert sorted(_steps(ring)) == list(range(16))
    # the window's steps are in the ring, their annotations in the window only
    assert sum(1 for s in ring.iter_spans() if s.name == "forward") == 16 - 3


def test_dumps_are_rate_limited_and_the_rest_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "flight"
    recorder = _recorder(out, steps=5, min_steps_between=10, max_dumps=2, slow_min_s=0.01)
    with stepscope.profile(flight_recorder=recorder) as prof:
        for step in range(60):
            _spin(0.001)
            if step >= 16 and step % 3 == 0:
                time.sleep(0.03)  # a slow step every third step from 18 on
            prof.step()
    assert prof.flight is not None
    assert len(_dumps(out, "slow_step")) == 2
    suppressed = prof.flight.suppressed["slow_step"]
    assert suppressed >= 10
    assert f"{suppressed} dump(s) suppressed ({suppressed} slow_step)" in capsys.readouterr().err


def test_a_dump_that_cannot_be_written_is_counted_and_the_program_goes_on(
    tmp_path: Path,
) -> None:
    out = tmp_path / "flight"
    before = failure_counts().get("flight", {}).get("dump_error", 0)
    recorder = _recorder(out, steps=3, slow_min_s=0.15)
    with stepscope.profile(flight_recorder=recorder) as prof:
        for step in range(30):
            _spin(0.001)
            if step == 12:
                out.rmdir()
                out.write_text("not a directory any more")
                time.sleep(0.3)
            prof.step()
    assert prof.step_num == 30
    assert failure_counts()["flight"]["dump_error"] >= before + 1
    assert prof.flight is not None
    written = [int(re.findall(r"-step(\d+)\.", Path(p).name)[0]) for p in prof.flight.dumps]
    assert all(step < 12 for step in written)  # a stall of the host may have dumped before


def test_bad_settings_are_one_clear_error() -> None:
    with pytest.raises(ValueError, match="flight_recorder steps must be a whole number of 1"):
        stepscope.FlightRecorder(steps=0)
    with pytest.raises(ValueError, match="slow_factor must be a number above 1"):
        stepscope.FlightRecorder(slow_factor=0.5)
    with pytest.raises(ValueError, match="hang_s must be a finite number"):
        stepscope.FlightRecorder(hang_s=float("inf"))
    with pytest.raises(TypeError, match="flight_recorder must be a number of steps"):
        stepscope.profile(flight_recorder="many")  # type: ignore[arg-type]


def test_forget_before_drops_the_same_samples_in_c_and_in_the_twin(implementation: str) -> None:
    parked = threading.Event()
    worker = threading.Thread(target=parked.wait, daemon=True)
    worker.start()
    try:
        _, backend = make_backend(implementation, 1000, 64, [worker.native_id or 0])
        stamps = []
        for _ in range(6):
            assert backend.sample() == 1
            stamps.append(backend.export()["sample_ts"])
            time.sleep(0.002)
        before = backend.interned()
        cut = int.from_bytes(stamps[3][-8:], sys.byteorder, signed=True)  # the 4th sample's
        assert backend.forget_before(cut) == 3
        assert backend.count() == 3
        assert backend.export()["sample_ts"] == stamps[5][3 * 8 :]
        assert backend.interned() == before  # frames and stacks stay
        assert backend.forget_before(0) == 0
    finally:
        parked.set()


def _run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=180,
                          env=_child_env(), cwd=kwargs.pop("cwd", ROOT), **kwargs)  # fmt: skip


def _without_flight_lines(text: str) -> str:
    return "".join(
        line for line in text.splitlines(keepends=True) if "stepscope: flight recorder" not in line
    )


@pytest.mark.slow
def test_the_programs_output_status_and_traceback_are_the_same_with_the_recorder(
    tmp_path: Path,
) -> None:
    for mode, bad in (("slow", "12"), ("raise", "12")):
        out = tmp_path / mode
        plain = _run([sys.executable, str(PROGRAMS), mode, str(out), "30", bad])
        flown = _run([sys.executable, str(PROGRAMS), mode, str(out), "30", bad, "flight", "4"])
        assert flown.returncode == plain.returncode == (1 if mode == "raise" else 0)
        assert flown.stdout == plain.stdout
        assert _without_flight_lines(flown.stderr) == plain.stderr
        reason = "slow_step" if mode == "slow" else "exception"
        (dump,) = out.glob(f"*.flight-{reason}-step12.*.pt.trace.json")
        assert str(dump) in flown.stderr
        assert sorted(_steps(read_chrome_trace(dump))) == list(range(8, 13))


@pytest.mark.slow
def test_stepscope_run_flight_recorder_dumps_the_crash_of_a_torch_loop(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "stepscope", "run", "--flight-recorder", "4", "-o", str(out)]
    plain = _run([sys.executable, str(PROGRAMS), "torch", str(out), "25", "20"])
    run = _run([*command, str(PROGRAMS), "torch", str(out), "25", "20"])
    assert run.returncode == plain.returncode == 1
    assert run.stdout == plain.stdout
    assert plain.stderr.strip().splitlines()[-1] == "ValueError: bad batch at step 20"
    assert plain.stderr.strip().splitlines()[-1] in run.stderr
    (dump,) = _dumps(out / "flight", "exception")
    steps = _steps(read_chrome_trace(dump))
    assert sorted(steps) == list(range(16, 21)) and steps[20][2]
    assert re.search(r"flight recorder: \d+ dump\(s\)", run.stderr)
    report = _run([sys.executable, "-m", "stepscope", "report", str(dump)])
    assert report.returncode == 0, report.stderr
    assert "flight recorder dump (steps 16-20): exception" in report.stdout


@pytest.mark.slow
def test_a_rank_that_never_joins_the_all_reduce_is_dumped_by_the_others_watchdog(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    with __import__("socket").socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = _child_env(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=str(port))  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, str(PROGRAMS), "hang", str(tmp_path), "40", "12"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(_dumps(tmp_path, "hang")) < 2 and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.1)
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    (waiting,) = tmp_path.glob("*_rank0.flight-hang-step12.*.pt.trace.json")
    trace = read_chrome_trace(waiting)
    steps = _steps(trace)
    assert sorted(steps) == list(range(7, 13)) and steps[12][2]  # 5 before the hung step
    assert steps[12][1] >= 1.5e9
    flight = trace.metadata["stepscope_flight"]
    main = next(s for s in flight["stacks"].values() if s["name"] == "MainThread")
    assert "all_reduce" in main["frames"][-1]
    (sleeper,) = tmp_path.glob("*_rank1.flight-hang-step12.*.pt.trace.json")
    rank1 = read_chrome_trace(sleeper).metadata["stepscope_flight"]["stacks"]
    assert any("hang (" in s["frames"][-1] for s in rank1.values() if s["name"] == "MainThread")


@pytest.mark.slow
def test_memory_stays_flat_over_100k_steps(tmp_path: Path) -> None:
    done = _run([sys.executable, str(PROGRAMS), "trivial", str(tmp_path), "100000"])
    assert done.returncode == 0, done.stderr
    rss = [int(line) for line in done.stdout.split()]
    assert len(rss) == 10
    assert max(rss[1:]) <= rss[1] * 1.05 and min(rss[1:]) >= rss[1] * 0.95, rss


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["loop", "hf", "lightning"])
def test_the_suites_training_shapes_run_unchanged_under_the_recorder(
    tmp_path: Path, cell: str
) -> None:
    pytest.importorskip("lightning" if cell == "lightning" else "transformers")
    side = tmp_path / "side.json"
    out = tmp_path / "out"
    run = _run([sys.executable, "-m", "stepscope", "run", "--flight-recorder", "20", "-o",
                str(out), str(ROOT / "tests" / "shape_programs.py"), cell, str(side)])  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "finished"
    seen = json.loads(side.read_text())
    assert seen["iterations"] == len(seen["steps"]) == 13  # the program's own count
    assert not any(step["any_recorded"] for step in seen["steps"])  # no window: the ring only
    assert not _dumps(out / "flight", "exception")
    assert re.search(r"flight recorder: \d+ dump\(s\)", run.stderr)


def test_a_child_forked_under_the_recorder_records_nothing_of_the_parents(tmp_path: Path) -> None:
    from stepscope.collectors.annotations import is_recording

    with stepscope.profile(flight_recorder=_recorder(tmp_path / "flight", steps=3)) as prof:
        for _ in range(5):
            _spin(0.001)
            prof.step()
        pid = os.fork()
        if pid == 0:  # the child: inert, then free to record its own ring
            code = 1
            try:
                if active_flight() is None and not is_recording():
                    with stepscope.profile(flight_recorder=_recorder(tmp_path / "child")) as own:
                        own.step()
                        assert own.flight is not None
                        own.flight.dump_now()
                    code = 0 if len(list((tmp_path / "child").iterdir())) == 1 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert active_flight() is prof.flight and is_recording()
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.slow
def test_stepscope_attach_dump_prints_the_dump_of_a_running_process(tmp_path: Path) -> None:
    env = _child_env(STEPSCOPE_LISTEN_DIR=str(tmp_path / "ctl"))
    out = tmp_path / "flight"
    target = subprocess.Popen(
        [sys.executable, str(PROGRAMS), "slow", str(out), "100000", "-1", "flight", "5"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        sock = tmp_path / "ctl" / f"{target.pid}.sock"
        deadline = time.monotonic() + 60
        while not sock.exists() and time.monotonic() < deadline:
            assert target.poll() is None, target.communicate()
            time.sleep(0.05)
        attach = subprocess.run(
            [sys.executable, "-m", "stepscope", "attach", str(target.pid), "--dump"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        target.kill()
        target.communicate()
    assert attach.returncode == 0, attach.stderr
    found = re.fullmatch(rf"{target.pid}: flight recorder dump at step \d+: (\S+)\n", attach.stdout)
    assert found is not None, attach.stdout
    trace = read_chrome_trace(found.group(1))
    assert trace.metadata["stepscope_flight"]["reason"] == "attach"
    assert len(_steps(trace)) == 6
