"""torch operators in stepscope's trace: merge, alignment, automatic steps, tables, HTA, ET."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import stepscope  # noqa: E402
from stepscope import profile, record_function, schedule  # noqa: E402
from stepscope.collectors.torch import TorchCollector  # noqa: E402
from stepscope.profiler.execution_trace import ExecutionTraceObserver  # noqa: E402
from stepscope.trace import Span, read_chrome_trace  # noqa: E402

pytestmark = pytest.mark.torch


def mlp() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train(model: Any, opt: Any, steps: int, prof: profile | None = None) -> None:
    for _ in range(steps):
        with record_function("forward"):
            loss = model(torch.randn(16, 32)).pow(2).mean()
        with record_function("backward"):
            loss.backward()
        opt.step()
        opt.zero_grad()
        if prof is not None:
            prof.step()


def quiet_schedule(**kwargs: int) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return schedule(**kwargs)


def torch_collector(prof: profile) -> TorchCollector:
    (collector,) = [c for c in prof.collectors if isinstance(c, TorchCollector)]
    return collector


def test_torch_is_used_automatically_once_imported() -> None:
    assert any(isinstance(c, TorchCollector) for c in profile().collectors)
    assert not any(isinstance(c, TorchCollector) for c in profile(torch_ops=False).collectors)


def test_optimizer_steps_drive_the_schedule_without_prof_step() -> None:
    model, opt = mlp()
    windows: list[list[str]] = []

    def keep(p: profile) -> None:
        windows.append(
            sorted(s.trace_name for s in p.events() if s.trace_name.startswith("ProfilerStep#"))
        )

    with profile(
        schedule=quiet_schedule(wait=1, warmup=1, active=2, repeat=2),
        on_trace_ready=keep,
        step_on="optimizer",
    ) as prof:
        train(model, opt, 8)
    assert prof.step_num == 8
    assert windows == [["ProfilerStep#2", "ProfilerStep#3"], ["ProfilerStep#6", "ProfilerStep#7"]]


def test_optimizer_steps_with_memory_leave_torch_hooks_alone() -> None:
    # The memory collector adds and removes a global optimizer hook at each window's start and
    # stop; from inside torch's loop over those hooks that raised "OrderedDict mutated during
    # iteration" into the program.
    model, opt = mlp()
    with profile(
        schedule=quiet_schedule(wait=1, warmup=1, active=2, repeat=2),
        profile_memory=True,
        acc_events=True,
        step_on="optimizer",
    ) as prof:
        train(model, opt, 8)
    assert prof.step_num == 8
    steps = sorted(s.trace_name for s in prof.events() if s.trace_name.startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#6", "ProfilerStep#7"]


def test_torch_ops_are_merged_and_aligned_inside_annotations() -> None:
    model, opt = mlp()
    with profile(step_on="optimizer") as prof:
        train(model, opt, 3)
    spans = prof.events()
    cats = {s.cat for s in spans}
    assert {"cpu_op", "user_annotation"} <= cats
    forwards = [s for s in spans if s.name == "forward" and s.cat == "user_annotation"]
    addmms = [s for s in spans if s.name == "aten::addmm"]
    assert len(forwards) == 3 and len(addmms) == 6
    for op in addmms:
        enclosing = [f for f in forwards if f.start_ns <= op.start_ns and op.end_ns <= f.end_ns]
        assert len(enclosing) == 1, (op, forwards)
    # torch's own annotations survive; our annotations are not duplicated
    names = [s.name for s in spans]
    assert any(n.startswith("Optimizer.step#SGD.step") for n in names)
    assert names.count("forward") == 3
    assert prof.trace().metadata["stepscope_torch_events"] > 0


def test_record_shapes_and_memory_reach_the_trace(tmp_path: Path) -> None:
    model, opt = mlp()
    with profile(record_shapes=True, profile_memory=True) as prof:
        train(model, opt, 1)
    addmm = next(s for s in prof.events() if s.name == "aten::addmm")
    assert addmm.args is not None and addmm.args["Input Dims"][0] == [32]
    # Kineto's bookkeeping is dropped; concrete inputs stay where they say something
    shaped = [s.args for s in prof.events() if s.args and "Input Dims" in s.args]
    assert not any("Ev Idx" in a for a in shaped)
    concrete = [a["Concrete Inputs"] for a in shaped if "Concrete Inputs" in a]
    assert concrete and all(any(c) for c in concrete)
    memory = [i for i in prof.trace().iter_instants() if i.name == "[memory]"]
    assert memory and all("Bytes" in (i.args or {}) for i in memory)
    by_shape = prof.key_averages(group_by_input_shape=True)
    assert any(r.key == "aten::addmm" and r.input_shapes for r in by_shape)
    path = tmp_path / "t.json"
    prof.export_chrome_trace(path)
    doc = json.loads(path.read_text())
    assert doc["record_shapes"] == 1 and doc["profile_memory"] == 1


def test_key_averages_match_torch_names_and_counts() -> None:
    model, opt = mlp()
    with profile(record_shapes=True) as prof:
        train(model, opt, 4, prof)
    theirs = {
        e.key: e.count
        for e in torch_collector(prof).last_result.key_averages()
        if e.key.startswith("aten::")
    }
    ours = {r.key: r.count for r in prof.key_averages() if r.key.startswith("aten::")}
    assert ours == theirs
    assert ours["aten::addmm"] == 8


def test_two_windows_and_a_second_profile_both_record_torch_ops() -> None:
    model, opt = mlp()
    counts: list[int] = []

    def keep(p: profile) -> None:
        counts.append(sum(1 for s in p.events() if s.cat == "cpu_op"))

    for _ in range(2):
        with profile(
            schedule=quiet_schedule(wait=0, warmup=1, active=1, repeat=2),
            on_trace_ready=keep,
            step_on="optimizer",
        ):
            train(model, opt, 4)
    assert len(counts) == 4 and all(c > 20 for c in counts), counts


def test_bridged_annotations_are_not_duplicated() -> None:
    model, opt = mlp()
    prof = profile(torch_ops=False)
    collector = TorchCollector(bridge_annotations=True)
    prof.collectors.append(collector)
    with prof:
        train(model, opt, 2)
    torch_names = [e.key for e in collector.last_result.key_averages()]
    assert "forward" in torch_names  # torch recorded our annotation (GPU annotations need this)
    names = [s.name for s in prof.events()]
    assert names.count("forward") == 2
    # each span kept torch's ids: torch's own events for the block have the same External ids
    ours = {e.args["External id"] for e in prof.events() if e.name == "forward" and e.args}
    theirs = {e.id for e in collector.last_result.function_events if e.name == "forward"}
    assert len(ours) == 2 and ours == theirs


def test_a_failing_bridge_is_counted_and_never_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.autograd.profiler as autograd_profiler

    from stepscope.collectors.torch import take_bridge_errors, want_bridge

    def broken(name: str, args: Any = None) -> Any:
        raise RuntimeError("torch's record_function failed")

    monkeypatch.setattr(autograd_profiler, "record_function", broken)
    take_bridge_errors()
    want_bridge("test", True)
    try:
        with record_function("## block ##"):
            done = True
        with record_function("## second block ##"):  # the bridge is off after a failure
            pass
    finally:
        want_bridge("test", False)
    assert done and take_bridge_errors() == 1


def test_step_on_a_function_without_torch_optimizer() -> None:
    from tests import steppable

    with profile(step_on="tests.steppable:train_step", torch_ops=False) as prof:
        for _ in range(3):
            steppable.train_step()
    assert prof.step_num == 3
    assert steppable.train_step.__name__ == "train_step"
    assert not hasattr(steppable.train_step, "__wrapped__")  # restored after the profile
    with profile(step_on=steppable.Loop.step, torch_ops=False) as prof2:
        loop = steppable.Loop()
        loop.step()
        loop.step()
    assert prof2.step_num == 2 and loop.count == 2
    with pytest.raises(ValueError, match="module:qualname"):
        profile(step_on="no_colon_here")
    with pytest.raises(ValueError, match="not found"):
        profile(step_on="tests.steppable:missing")


def test_execution_trace_delegates_to_torch(tmp_path: Path) -> None:
    model, opt = mlp()
    et = ExecutionTraceObserver().register_callback(str(tmp_path / "et.json"))
    assert et.delegates_to_torch and et.is_registered and not et.is_running()
    with profile(execution_trace_observer=et) as prof:
        train(model, opt, 1, prof)
    assert not et.is_registered
    doc = json.loads((tmp_path / "et.json").read_text())
    names = {n["name"] for n in doc["nodes"]}
    assert "aten::addmm" in names


def test_execution_trace_without_torch_writes_the_span_call_graph(tmp_path: Path) -> None:
    out = tmp_path / "et.json"
    script = textwrap.dedent(
        f"""
        import sys
        import stepscope
        from stepscope.profiler.execution_trace import ExecutionTraceObserver
        et = ExecutionTraceObserver()
        try:
            et.get_output_file_path()
        except RuntimeError as e:
            print("error-before-register:", "registered first" in str(e))
        et.register_callback({str(out)!r})
        assert not et.delegates_to_torch and "torch" not in sys.modules
        with stepscope.profile(execution_trace_observer=et):
            with stepscope.record_function("outer"):
                with stepscope.record_function("inner"):
                    pass
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert "error-before-register: True" in result.stdout
    doc = json.loads(out.read_text())
    assert set(doc) >= {"schema", "pid", "nodes", "start_ts", "finish_ts"}
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert nodes["inner"]["ctrl_deps"] == nodes["outer"]["id"]
    root = nodes["[pytorch|profiler|execution_trace|process]"]
    assert nodes["outer"]["ctrl_deps"] == root["id"]  # no schedule, no step: no ProfilerStep


def test_trace_loads_in_hta(tmp_path: Path, monkeypatch: Any) -> None:
    hta = pytest.importorskip("hta.trace_analysis")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    model, opt = mlp()
    with profile(
        schedule=quiet_schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=stepscope.trace_handler(tmp_path),
        step_on="optimizer",
    ):
        train(model, opt, 6)
    (name,) = os.listdir(tmp_path)
    assert '"rank": 0' in (tmp_path / name).read_text()
    analysis = hta.TraceAnalysis(trace_dir=str(tmp_path))
    assert list(analysis.t.get_all_traces()) == [0]
    frame = analysis.t.get_trace(0)
    symbols = analysis.t.symbol_table.get_sym_table()
    step_names = {
        symbols[i] for i in frame["name"].unique() if symbols[i].startswith("ProfilerStep#")
    }
    # HTA leaves out the last step of a trace by design (include_last_profiler_step=False)
    assert step_names == {"ProfilerStep#2", "ProfilerStep#3"}
    assert analysis.t.meta_data[0]["distributedInfo"]["rank"] == 0


def test_reading_back_keeps_torch_events(tmp_path: Path) -> None:
    model, opt = mlp()
    with profile() as prof:
        train(model, opt, 1)
    path = tmp_path / "t.json.gz"
    prof.export_chrome_trace(path)
    back = read_chrome_trace(path)
    assert back.event_count() == prof.trace().event_count()
    spans: list[Span] = list(back.iter_spans())
    assert any(s.cat == "cpu_op" for s in spans)


def test_distributed_info_comes_from_an_initialised_process_group(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import socket as socket_module

    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    with socket_module.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.delenv("RANK", raising=False)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        with (
            profile(on_trace_ready=stepscope.trace_handler(tmp_path)) as prof,
            record_function("step"),
        ):
            pass
    finally:
        dist.destroy_process_group()
    info = prof.trace().distributed_info
    assert info is not None
    assert (info["backend"], info["rank"], info["world_size"]) == ("gloo", 0, 1)
    assert info["pg_count"] >= 1
    (name,) = os.listdir(tmp_path)
    assert name.endswith(".pt.trace.json") and "_rank0." in name
    assert '"rank": 0' in (tmp_path / name).read_text()


def test_no_span_of_the_program_outlives_the_window_it_ended_in() -> None:
    # issue 36, point 4: the window ends in the optimizer's post-hook, inside torch's
    # ``Optimizer.step#...`` span; torch ended that span after our stop, collection and a
    # slow trace handler, so the report's top row was our own time
    import time

    model, opt = mlp()
    slow_save = 1.0
    windows: list[Any] = []

    def keep(prof: profile) -> None:
        windows.append(prof.events())
        time.sleep(slow_save)

    with profile(
        schedule=quiet_schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=keep,
        step_on="optimizer",
    ):
        train(model, opt, 6)
    [spans] = windows
    steps = sorted(
        (s for s in spans if s.trace_name.startswith("ProfilerStep#")), key=lambda s: s.start_ns
    )
    opt_steps = sorted(
        (s for s in spans if s.name.startswith("Optimizer.step#")), key=lambda s: s.start_ns
    )
    last_step, last_opt = steps[-1], opt_steps[-1]
    assert last_step.start_ns <= last_opt.start_ns, "the window's last optimizer step is its own"
    assert last_opt.end_ns - last_step.end_ns < slow_save * 1e9 / 2, (last_opt, last_step)
    assert (last_opt.args or {}).get("stepscope.open_at_window_end") is True
    assert all(not (s.args or {}).get("stepscope.open_at_window_end") for s in opt_steps[:-1])


def test_the_trace_names_the_optimizers_whose_steps_end_steps() -> None:
    # issue 36, point 6: two optimizers stepping in turn make each iteration two steps
    from stepscope.analysis.analyze import analyze_trace

    gen, disc = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    opt_d = torch.optim.Adam(disc.parameters())
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
    with profile(
        schedule=quiet_schedule(wait=5, warmup=1, active=4, repeat=1), step_on="optimizer"
    ) as prof:
        for _ in range(6):  # 12 steps: 5 unrecorded, enough for a figure but for the turn
            disc(gen(torch.randn(2, 4)).detach()).sum().backward()
            opt_d.step()
            disc(gen(torch.randn(2, 4))).sum().backward()
            opt_g.step()
    trace = prof.trace()
    assert trace.metadata["stepscope_step_source"] == {
        "on": "optimizer",
        "optimizers": ["Adam", "SGD"],
    }
    summary = analyze_trace(trace)
    assert any("2 optimizers (Adam, SGD) step in turn" in n for n in summary.notes), summary.notes
    # medians of D and G steps mixed in different proportions compare nothing: no figure
    from stepscope.report.overhead import overhead_lines

    assert summary.overhead is not None and summary.overhead.slowdown_pct is None
    assert summary.overhead.optimizers_in_turn == 2
    assert "2 optimizers end steps in turn" in overhead_lines(summary.overhead)[0]


def _episodes(prof_activities: list[Any] | None) -> Any:
    """An actor-critic shape: each step is an episode of policy forwards between pure-Python
    environment steps, then one backward and one optimizer step."""
    from stepscope.analysis.analyze import analyze_trace

    policy = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.Adam(policy.parameters())

    def env_step(action: int) -> list[float]:
        state = [0.0] * 4
        for i in range(20000):  # the environment's own Python, no torch
            state[i % 4] += (action + i) * 1e-6
        return state

    with profile(
        activities=prof_activities,
        schedule=quiet_schedule(wait=1, warmup=1, active=3, repeat=1),
        step_on="optimizer",
        sampling_rate_hz=1000.0,  # a few hundred samples over the window's episodes
    ) as prof:
        for _ in range(5):
            state, log_probs = [0.0] * 4, []
            for _ in range(8):
                probs = policy(torch.tensor(state)).softmax(-1)
                action = int(probs.argmax())
                log_probs.append(probs[action].log())
                state = env_step(action)
            (-torch.stack(log_probs).sum()).backward()
            opt.step()
            opt.zero_grad()
    return analyze_trace(prof.trace())


def test_python_nothing_named_is_a_recommendation_to_sample() -> None:
    # issue 36, point 7: an RL program's steps were 39.7 % idle_other, with no hint that stack
    # samples would name that Python
    unsampled = _episodes(None)
    rules = {r.rule: r for r in unsampled.recommendations}
    assert "unnamed_python" in rules, [r.rule for r in unsampled.recommendations]
    evidence = rules["unnamed_python"].evidence
    assert evidence["idle_other_pct"] + evidence["forward_python_pct"] > 25
    sampled = _episodes([stepscope.ProfilerActivity.CPU, stepscope.ProfilerActivity.SAMPLING])
    assert "unnamed_python" not in {r.rule for r in sampled.recommendations}
    shares = {c.name: c.pct for c in sampled.host_total.categories}
    assert shares["python"] > 25, shares  # the environment's Python, named by the samples
    assert any("env_step" in f.name for f in sampled.functions), sampled.functions[:5]
