"""stepscope.profile: the action state machine, windows, step spans, handlers, metadata, results."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import signal
import socket
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope import ProfilerAction, profile, record_function, schedule, trace_handler
from stepscope.collectors.base import Collector, WindowContext
from stepscope.trace import TraceBuilder, read_chrome_trace

# C-part tests (`-m native`): also run under Python 3.12 and 3.13 by `make test-monitoring`.
pytestmark = pytest.mark.native


class Recorder(Collector):
    """A collector that logs its lifecycle and adds one span per window."""

    name = "recorder"

    def __init__(self, log: list[str], fail_in: str | None = None) -> None:
        self.log = log
        self.fail_in = fail_in

    def _hit(self, phase: str) -> None:
        self.log.append(phase)
        if phase == self.fail_in:
            raise RuntimeError(f"recorder broke in {phase}")

    def prepare(self, ctx: WindowContext) -> None:
        self._hit("prepare")

    def start(self, ctx: WindowContext) -> None:
        self._hit("start")

    def stop(self, ctx: WindowContext) -> None:
        self._hit("stop")

    def collect(self, builder: TraceBuilder, ctx: WindowContext) -> None:
        self._hit("collect")
        builder.span("recorder-window", "test", ctx.pid, 1, ctx.start_ns, ctx.end_ns - ctx.start_ns)


def run_loop(steps: int, **kwargs: Any) -> tuple[profile, list[str]]:
    log: list[str] = []
    kwargs.setdefault("on_trace_ready", lambda p: log.append(f"ready@{p.step_num}"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = profile(collectors=[Recorder(log)], **kwargs)
    with prof:
        for _ in range(steps):
            log.append(f"step{prof.step_num}:{prof.current_action.name}")
            prof.step()
    return prof, log


@pytest.mark.torch
@pytest.mark.parametrize(
    "sched",
    [
        dict(wait=1, warmup=1, active=2, repeat=2),
        dict(wait=0, warmup=0, active=1, repeat=3),
        dict(wait=2, warmup=2, active=1),
        dict(wait=0, warmup=1, active=3, skip_first=2),
    ],
)
@pytest.mark.parametrize("steps", [0, 1, 3, 4, 7, 12])
def test_action_sequence_matches_torch(sched: dict[str, int], steps: int, monkeypatch: Any) -> None:
    """Drive torch's own profile with its actions patched to log, and compare with ours."""
    tp = pytest.importorskip("torch.profiler")
    torch_log: list[str] = []
    for method in ("prepare_trace", "start_trace", "stop_trace"):
        monkeypatch.setattr(
            tp.profile, method, lambda self, m=method: torch_log.append(m.split("_")[0])
        )
    monkeypatch.setattr(tp.profile, "_trace_ready", lambda self: torch_log.append("ready"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = tp.profile(schedule=tp.schedule(**sched), activities=[tp.ProfilerActivity.CPU])
        with theirs:
            for _ in range(steps):
                theirs.step()
    ours_log: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = profile(
            schedule=schedule(**sched),
            on_trace_ready=lambda p: ours_log.append("ready"),
            collectors=[Recorder(ours_log)],
            flush_on_exit=False,
        )
    with prof:
        for _ in range(steps):
            prof.step()
    ours = [e for e in ours_log if e != "collect"]
    assert ours == torch_log


def test_windows_follow_the_schedule() -> None:
    _, log = run_loop(9, schedule=schedule(wait=1, warmup=1, active=2, repeat=2))
    assert log == [
        "step0:NONE",
        "prepare",
        "step1:WARMUP",
        "start",
        "step2:RECORD",
        "step3:RECORD_AND_SAVE",
        "stop",
        "collect",
        "ready@4",
        "step4:NONE",
        "prepare",
        "step5:WARMUP",
        "start",
        "step6:RECORD",
        "step7:RECORD_AND_SAVE",
        "stop",
        "collect",
        "ready@8",
        "step8:NONE",
    ]


def test_step_spans_are_named_by_absolute_step() -> None:
    windows: list[list[str]] = []

    def keep(p: profile) -> None:
        windows.append(
            sorted(s.trace_name for s in p.events() if s.trace_name.startswith("ProfilerStep#"))
        )

    run_loop(10, schedule=schedule(wait=1, warmup=1, active=2, repeat=2), on_trace_ready=keep)
    assert windows == [["ProfilerStep#2", "ProfilerStep#3"], ["ProfilerStep#6", "ProfilerStep#7"]]


def test_step_spans_are_user_annotations_on_the_loop_thread() -> None:
    prof, _ = run_loop(3)
    steps = [s for s in prof.events() if s.trace_name.startswith("ProfilerStep#")]
    assert {s.name for s in steps} == {"ProfilerStep*"}  # torch's grouping name
    assert [s.trace_name for s in steps] == [
        "ProfilerStep#0",
        "ProfilerStep#1",
        "ProfilerStep#2",
        "ProfilerStep#3",
    ]
    assert {s.cat for s in steps} == {"user_annotation"}
    assert {s.tid for s in steps} == {threading.get_native_id()}
    for a, b in itertools.pairwise(steps):
        assert a.end_ns <= b.start_ns


@pytest.mark.parametrize(
    ("exit_after", "flush", "ready_calls", "complete"),
    [
        (0, True, 0, None),  # ended in NONE: nothing to save
        (1, True, 1, False),  # ended in WARMUP: flushed (torch saves nothing)
        (1, False, 0, None),
        (2, True, 1, False),  # ended in RECORD: saved, marked incomplete
        (2, False, 1, False),
        (3, True, 1, None),  # ended at RECORD_AND_SAVE: a normal save
    ],
)
def test_early_exit_in_each_phase(
    exit_after: int, flush: bool, ready_calls: int, complete: bool | None
) -> None:
    ready: list[profile] = []
    prof, log = run_loop(
        exit_after,
        schedule=schedule(wait=1, warmup=1, active=2),
        on_trace_ready=ready.append,
        flush_on_exit=flush,
    )
    assert len(ready) == ready_calls
    if ready_calls:
        meta = prof.trace().metadata
        assert meta.get("stepscope_window_complete") == complete
    if exit_after == 1 and not flush:
        assert log[-4:] == ["prepare", "start", "stop", "collect"]


def test_odd_transitions_warn_like_torch() -> None:
    plan = [
        ProfilerAction.WARMUP,
        ProfilerAction.NONE,
        ProfilerAction.RECORD,
        ProfilerAction.NONE,
        ProfilerAction.RECORD,
        ProfilerAction.WARMUP,
        ProfilerAction.NONE,
    ]

    def sched(step: int) -> ProfilerAction:
        return plan[step] if step < len(plan) else ProfilerAction.NONE

    with pytest.warns(UserWarning) as caught:
        run_loop(len(plan), schedule=sched)
    messages = [str(w.message) for w in caught]
    assert "Incorrect schedule: WARMUP followed by NONE" in messages
    assert "Incorrect schedule: RECORD followed by NONE" in messages
    assert "Incorrect schedule: RECORD followed by WARMUP" in messages


def test_schedule_returning_garbage_is_a_type_error() -> None:
    prof = profile(schedule=lambda s: ProfilerAction.NONE if s == 0 else "RECORD")  # type: ignore
    prof.start()
    with pytest.raises(TypeError, match="must return a ProfilerAction"):
        prof.step()
    prof.stop()


def test_annotations_nest_across_threads_exceptions_and_generators() -> None:
    def worker() -> None:
        with record_function("in_thread"), record_function("inner_thread"):
            pass

    def gen() -> Any:
        with record_function("generator_body"):
            yield 1
            yield 2

    with profile() as prof, record_function("outer"):
        with pytest.raises(KeyError), record_function("raises"):
            raise KeyError("x")
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert list(gen()) == [1, 2]
    spans = {s.name: s for s in prof.events()}
    outer, raises = spans["outer"], spans["raises"]
    assert outer.start_ns <= raises.start_ns and raises.end_ns <= outer.end_ns
    assert spans["in_thread"].tid == t.native_id != outer.tid
    assert spans["in_thread"].start_ns <= spans["inner_thread"].start_ns
    assert spans["inner_thread"].end_ns <= spans["in_thread"].end_ns
    assert outer.start_ns <= spans["generator_body"].start_ns <= spans["generator_body"].end_ns
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["outer"].cpu_time_total_ns == outer.dur_ns
    assert rows["outer"].cpu_time_total == outer.dur_ns / 1000  # torch's unit: µs
    assert rows["outer"].self_cpu_time_total_ns < outer.dur_ns


def test_spans_open_at_window_end_are_closed_and_flagged() -> None:
    prof = profile()
    prof.start()
    block = record_function("still_open", {"k": 1})
    block.__enter__()
    prof.stop()
    block.__exit__(None, None, None)
    (span,) = [s for s in prof.events() if s.name == "still_open"]
    assert span.args == {"k": 1, "stepscope.open_at_window_end": True}
    assert prof.trace().metadata["stepscope_annotations_open_at_end"] >= 1


def test_nothing_is_recorded_outside_record_windows() -> None:
    with record_function("before"):
        pass
    prof, _ = run_loop(4, schedule=schedule(wait=2, warmup=1, active=1))
    names = {s.name for s in prof.events()}
    assert "before" not in names
    assert not any(
        n.startswith("ProfilerStep#") and n != "ProfilerStep#3"
        for n in names
        if n.startswith("ProfilerStep")
    )


def test_traced_names_the_span_after_the_function_and_keeps_behaviour() -> None:
    @stepscope.traced
    def add(a: int, b: int) -> int:
        return a + b

    @stepscope.traced(name="custom")
    async def coro() -> str:
        return "done"

    @record_function("gen")
    def numbers() -> Any:
        yield from range(3)

    import asyncio

    with profile() as prof:
        assert add(2, 3) == 5
        assert asyncio.run(coro()) == "done"
        assert list(numbers()) == [0, 1, 2]
    names = [s.name for s in prof.events()]
    assert (
        f"{__name__}.test_traced_names_the_span_after_the_function_and_keeps_behaviour.<locals>.add"
        in names
    )
    assert "custom" in names and "gen" in names
    assert add.__name__ == "add"


def test_record_function_rejects_bad_names() -> None:
    with pytest.raises(TypeError, match="name must be a str"):
        record_function(42)  # type: ignore[arg-type]


def test_acc_events_keeps_every_window() -> None:
    prof, _ = run_loop(8, schedule=schedule(wait=0, warmup=1, active=1), acc_events=True)
    # four complete windows, plus the one flushed because the loop ended during warmup
    assert len(prof.traces) == 5
    assert prof.traces[-1].metadata["stepscope_window_complete"] is False
    step_names = sorted(
        s.trace_name for s in prof.events() if s.trace_name.startswith("ProfilerStep#")
    )
    assert step_names == ["ProfilerStep#1", "ProfilerStep#3", "ProfilerStep#5", "ProfilerStep#7"]
    prof2, _ = run_loop(8, schedule=schedule(wait=0, warmup=1, active=1))
    assert len(prof2.traces) == 1


def test_trace_handler_names_files_and_writes_valid_traces(tmp_path: Path) -> None:
    out = tmp_path / "traces" / "nested"
    run_loop(6, schedule=schedule(wait=0, warmup=1, active=2), on_trace_ready=trace_handler(out))
    files = sorted(os.listdir(out))
    assert len(files) == 3  # two full windows and the warmup the loop ended in (flush_on_exit)
    pattern = re.compile(
        rf"^{re.escape(socket.gethostname())}_{os.getpid()}\.\d{{19}}\.pt\.trace\.json$"
    )
    assert all(pattern.match(f) for f in files), files
    for f in files[:2]:
        doc = json.loads((out / f).read_text())
        assert any(e.get("name", "").startswith("ProfilerStep#") for e in doc["traceEvents"])
    last = json.loads((out / files[2]).read_text())
    assert last["stepscope_window_complete"] is False


def test_trace_handler_gzip_worker_name_and_rank(tmp_path: Path, monkeypatch: Any) -> None:
    run_loop(2, on_trace_ready=trace_handler(tmp_path, worker_name="w0", use_gzip=True))
    (name,) = os.listdir(tmp_path)
    assert re.match(r"^w0\.\d+\.pt\.trace\.json\.gz$", name)
    assert len(read_chrome_trace(tmp_path / name).spans) > 0
    monkeypatch.setenv("RANK", "3")
    from stepscope.profiler.handlers import default_worker_name

    assert default_worker_name().endswith(f"_{os.getpid()}_rank3")


def test_trace_handler_reports_a_directory_it_cannot_create(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError, match=re.escape(str(blocker / "sub"))):
        trace_handler(blocker / "sub")
    with pytest.raises(ValueError, match="worker_name"):
        trace_handler(tmp_path, worker_name="a/b")


def test_metadata_flags_and_user_entries_reach_the_file(tmp_path: Path) -> None:
    paths: list[Path] = []

    def save(p: profile) -> None:
        paths.append(tmp_path / f"m{len(paths)}.json")
        p.export_chrome_trace(paths[-1])

    prof = profile(schedule=schedule(wait=0, warmup=1, active=1, repeat=2), on_trace_ready=save)
    prof.preset_metadata_json("run", '{"lr": 0.1}')
    with prof:
        prof.add_metadata("note", 'say "hi"')
        prof.add_metadata_json("batch", "[1, 2]")
        for _ in range(4):
            prof.step()
    first, second = (json.loads(p.read_text()) for p in paths)
    assert first["note"] == 'say "hi"' and first["batch"] == [1, 2] and first["run"] == {"lr": 0.1}
    assert "note" not in second and second["run"] == {"lr": 0.1}
    assert first["stepscope_clock"]["source"] == stepscope.clock.SOURCE
    assert first["host_name"] == socket.gethostname()
    assert prof.trace_files == [str(p) for p in paths]
    with pytest.raises(ValueError, match="not valid JSON"):
        prof.add_metadata_json("bad", "{nope")
    with pytest.raises(ValueError, match="non-empty str"):
        prof.add_metadata("", "x")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"record_shapes": True}, "record_shapes record through torch's profiler"),
        ({"with_flops": True}, "with_flops record"),
        ({"with_modules": True}, "with_modules record"),
        ({"experimental_config": object()}, "experimental_config record"),
        ({"activities": [stepscope.ProfilerActivity.CUDA]}, "activities CUDA record"),
    ],
)
def test_torch_options_without_torch_ops_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        profile(torch_ops=False, **kwargs)


def test_execution_trace_observer_must_be_an_observer() -> None:
    with pytest.raises(TypeError, match="ExecutionTraceObserver"):
        profile(execution_trace_observer=object())


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown profiler activity"):
        profile(activities=["GPU"])
    with pytest.raises(TypeError, match="schedule must be callable"):
        profile(schedule=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="on_trace_ready must be callable"):
        profile(on_trace_ready="x")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="no window has been recorded"):
        profile().key_averages()


@pytest.mark.torch
def test_torch_activity_values_are_accepted() -> None:
    tp = pytest.importorskip("torch.profiler")
    prof = profile(activities=[tp.ProfilerActivity.CPU])
    assert prof.activities == {stepscope.ProfilerActivity.CPU}


def test_a_failing_collector_never_breaks_the_loop(caplog: Any) -> None:
    log: list[str] = []
    with caplog.at_level(logging.WARNING, logger="stepscope"):
        prof = profile(collectors=[Recorder(log, fail_in="start")])
        with prof:
            with record_function("work"):
                pass
            prof.step()
    assert "work" in {s.name for s in prof.events()}
    assert "stop" not in log  # the broken collector is off for the rest of the window
    assert prof.trace().metadata["stepscope_collector_errors"] == {
        "recorder.start": "RuntimeError: recorder broke in start"
    }
    assert sum("recorder" in r.message for r in caplog.records) == 1
    strict = profile(collectors=[Recorder([], fail_in="start")], strict=True)
    with pytest.raises(RuntimeError, match="broke in start"):
        strict.start()
    strict.stop()


class Interrupted(Collector):
    """A collector during whose ``start`` a signal arrives (``raise_signal``: as when the
    program's timer fires while stepscope's code runs)."""

    name = "interrupted"

    def start(self, ctx: WindowContext) -> None:
        signal.raise_signal(signal.SIGALRM)
        for _ in range(100):  # the handler runs at the next check of the interpreter's
            pass


def test_the_programs_signal_handler_exception_reaches_the_program_not_the_failure_count() -> None:
    """The program's SIGALRM handler raises its timeout while a collector hook runs: the program
    gets its exception as without stepscope; it is not taken for the collector's failure.  A
    collector raising the same exception itself is still counted and swallowed."""
    from stepscope.failures import failure_counts

    def timeout(signum: int, frame: object) -> None:
        raise TimeoutError("the program's own timeout")

    previous = signal.signal(signal.SIGALRM, timeout)
    before = failure_counts().get("collectors", {}).get("collector_error", 0)
    try:
        prof = profile(collectors=[Interrupted()])
        with pytest.raises(TimeoutError, match="the program's own timeout"):
            prof.start()
        prof.stop()
        assert failure_counts().get("collectors", {}).get("collector_error", 0) == before

        class RaisesItself(Collector):
            name = "raises_itself"

            def start(self, ctx: WindowContext) -> None:
                raise TimeoutError("the collector's own")

        with profile(collectors=[RaisesItself()]) as prof:
            prof.step()
        assert failure_counts()["collectors"]["collector_error"] == before + 1
    finally:
        signal.signal(signal.SIGALRM, previous)


class InterruptedInClose(Collector):
    """A collector during whose ``close`` the program's signal handler raises (as torch's SIGCHLD
    handler does when a DataLoader worker dies while the profile stops)."""

    name = "interrupted_in_close"

    def __init__(self, closed: list[str]) -> None:
        self.closed = closed

    def close(self) -> None:
        signal.raise_signal(signal.SIGALRM)
        for _ in range(100):
            pass
        self.closed.append("never")  # the handler raised above


class Closes(Collector):
    """A collector that notes its ``close``."""

    name = "closes"

    def __init__(self, closed: list[str]) -> None:
        self.closed = closed

    def close(self) -> None:
        self.closed.append(self.name)


def test_a_signal_handler_raising_while_the_profile_stops_still_leaves_it_stopped() -> None:
    """The program's exception reaches it, every later cleanup step still runs, and the process
    can start another profile (before: the profile stayed registered and refused every later
    one in the process)."""
    from stepscope.profiler.profile import active_profile

    def worker_died(signum: int, frame: object) -> None:
        raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.")

    previous = signal.signal(signal.SIGALRM, worker_died)
    closed: list[str] = []
    try:
        prof = profile(collectors=[InterruptedInClose(closed), Closes(closed)])
        with pytest.raises(RuntimeError, match="is killed by signal"), prof:
            prof.step()
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert closed == ["closes"]  # the collector after the interrupted one was closed too
    assert active_profile() is None
    assert stepscope.current_step() is None
    with profile() as after:
        after.step()
    assert after.step_num == 1


class ChildExitsInClose(Collector):
    """A collector during whose ``close`` a child's exit is signalled (SIGCHLD)."""

    name = "child_exits_in_close"

    def __init__(self, closed: list[str]) -> None:
        self.closed = closed

    def close(self) -> None:
        signal.raise_signal(signal.SIGCHLD)
        for _ in range(100):
            pass
        self.closed.append(self.name)


def test_the_programs_sigchld_handler_runs_after_the_stop_and_its_exception_reaches_it(
    tmp_path: Path,
) -> None:
    """torch's DataLoader handler raises on a SIGCHLD once a worker died: a child exiting while
    the profile stops has it run after the stop, which finishes whole (every close, the file)."""
    calls: list[int] = []

    def worker_died(signum: int, frame: object) -> None:
        calls.append(signum)
        raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.")

    previous = signal.signal(signal.SIGCHLD, worker_died)
    closed: list[str] = []
    try:
        prof = profile(
            collectors=[ChildExitsInClose(closed), Closes(closed)],
            on_trace_ready=stepscope.trace_handler(tmp_path),
        )
        with pytest.raises(RuntimeError, match="is killed by signal"), prof:
            prof.step()
        assert signal.getsignal(signal.SIGCHLD) is worker_died  # the program's, back
    finally:
        signal.signal(signal.SIGCHLD, previous)
    assert calls == [signal.SIGCHLD]
    assert closed == ["child_exits_in_close", "closes"]
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_two_profiles_cannot_record_at_once() -> None:
    with profile(), pytest.raises(RuntimeError, match="already running"):
        profile().start()


def test_step_counter_is_shared() -> None:
    assert stepscope.current_step() is None
    with profile() as prof:
        assert stepscope.current_step() == 0
        prof.step()
        prof.step()
        assert stepscope.current_step() == 2
    assert stepscope.current_step() is None


def test_export_stacks_from_a_real_window(tmp_path: Path) -> None:
    def spin(n: int) -> int:
        return sum(range(n))

    with profile() as prof, record_function("outer"), record_function("inner"):
        spin(200_000)
    path = tmp_path / "stacks.txt"
    lines = prof.export_stacks(path)
    text = path.read_text().splitlines()
    assert len(text) == lines > 0
    assert text[0].startswith("outer;inner ")  # no schedule, no step(): no ProfilerStep
    with pytest.raises(ValueError, match="unknown export_stacks metric"):
        prof.export_stacks(path, "wall")


def run_twice(fn: Callable[[], None]) -> None:
    fn()
    fn()


def test_a_second_profile_in_the_same_process_works() -> None:
    results: list[int] = []

    def once() -> None:
        with profile() as prof, record_function("again"):
            pass
        results.append(sum(1 for s in prof.events() if s.name == "again"))

    run_twice(once)
    assert results == [1, 1]


def test_counter_tracks_are_sampled_at_every_recorded_step() -> None:
    from stepscope.collectors.counters import CounterCollector
    from stepscope.counters import CounterSet

    work = CounterSet("test_profile_work")
    with profile(
        schedule=schedule(wait=1, warmup=1, active=3), collectors=[CounterCollector([work])]
    ) as prof:
        for _ in range(5):
            work.inc("items", 10)
            prof.step()
    events = [
        e for e in prof.trace().iter_counter_events() if e.name == "counters.test_profile_work"
    ]
    # start (step 2), the boundaries 2->3 and 3->4, and stop: four samples, growing by 10 a step
    assert [e.values["items"] for e in events] == [20.0, 30.0, 40.0, 50.0]


def test_a_trace_that_cannot_be_written_does_not_stop_the_loop(tmp_path: Path, caplog: Any) -> None:
    from stepscope.profiler.handlers import write_failures

    out = tmp_path / "traces"
    handler = trace_handler(out)
    out.rmdir()
    out.write_text("now a file, not a directory")  # every later write fails
    before = write_failures().get("trace_write_error", 0)
    with caplog.at_level(logging.WARNING, logger="stepscope"):
        prof, _ = run_loop(6, schedule=schedule(wait=0, warmup=1, active=1), on_trace_ready=handler)
    assert prof.step_num == 6
    assert write_failures()["trace_write_error"] - before == 4  # 3 windows + the flushed warmup
    assert sum("trace write error" in r.message for r in caplog.records) == 1
    strict = profile(strict=True, on_trace_ready=handler)
    strict.start()
    with pytest.raises(OSError, match="cannot create the trace directory"):
        strict.stop()


class _FailingObserver:
    """An execution-trace observer whose stop() fails (e.g. its disk went away)."""

    def __init__(self) -> None:
        self.started = 0
        self.cleaned = 0

    def start(self) -> None:
        self.started += 1

    def stop(self) -> None:
        raise OSError("no space left on device")

    def cleanup(self) -> None:
        self.cleaned += 1


def test_a_failing_execution_trace_observer_never_reaches_the_loop() -> None:
    observer = _FailingObserver()
    with profile(execution_trace_observer=observer, torch_ops=False) as prof:
        for _ in range(2):
            prof.step()
    errors = prof.trace().metadata["stepscope_collector_errors"]
    assert errors == {"execution_trace.stop": "OSError: no space left on device"}
    assert observer.started == 1 and observer.cleaned == 1
    with (
        pytest.raises(OSError, match="no space left"),
        profile(execution_trace_observer=_FailingObserver(), torch_ops=False, strict=True),
    ):
        pass


@pytest.mark.torch
def test_the_default_activities_are_torch_profilers() -> None:
    """``activities=None`` records what torch.profiler's default does here (CPU, and CUDA on an
    NVIDIA machine: checked there with bench/cuda_trainers.py)."""
    tp = pytest.importorskip("torch.profiler")
    ours = {a.name for a in profile().activities}
    assert ours == {a.name for a in tp.supported_activities()}
