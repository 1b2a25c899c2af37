"""The Python function tracer: span trees, filters, budgets, threads, C and pure-Python twins."""

from __future__ import annotations

import cProfile
import json
import logging
import pstats
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import tests.tracer_workloads as w
from stepscope._ext import native
from stepscope.collectors.base import WindowContext
from stepscope.collectors.python import PythonTracerCollector
from stepscope.collectors.python_common import ModuleFilter, SourceNames, TracerOptions
from stepscope.trace.chrome_reader import read_chrome_trace
from stepscope.trace.chrome_writer import write_chrome_trace
from stepscope.trace.model import Trace, TraceBuilder

# C-part tests (`-m native`): also run under Python 3.12 and 3.13 by `make test-monitoring`.
pytestmark = pytest.mark.native

HAS_NATIVE = native() is not None
PY312 = sys.version_info >= (3, 12)


@dataclass
class Node:
    """One span with its children, rebuilt from Python id / Python parent id."""

    name: str
    tid: int | str
    start: int
    end: int
    args: dict[str, Any]
    children: list[Node] = field(default_factory=list)

    @property
    def short(self) -> str:
        return self.name.rsplit(": ", 1)[-1]

    def shape(self) -> tuple[str, list[Any]]:
        return (self.short, [c.shape() for c in self.children])

    def walk(self, depth: int = 0) -> list[tuple[int, str]]:
        out = [(depth, self.short)]
        for c in self.children:
            out.extend(c.walk(depth + 1))
        return out


def record(
    implementation: str,
    fn: Callable[[], object],
    *,
    builder: TraceBuilder | None = None,
    **options: Any,
) -> tuple[Trace, WindowContext, PythonTracerCollector]:
    """Drive one window of the collector around ``fn`` (into ``builder``, or a new one)."""
    collector = PythonTracerCollector(implementation=implementation, strict=True, **options)
    ctx = WindowContext(window=0)
    collector.prepare(ctx)
    collector.start(ctx)
    try:
        fn()
    finally:
        collector.stop(ctx)
    builder = builder if builder is not None else TraceBuilder()
    collector.collect(builder, ctx)
    collector.close()
    return builder.build(), ctx, collector


def nodes(trace: Trace) -> list[Node]:
    """Every python_function span as a Node, linked to its parent; checks the ids."""
    by_id: dict[int, Node] = {}
    parents: dict[int, int | None] = {}
    for s in trace.iter_spans():
        if s.cat != "python_function":
            continue
        assert s.args is not None
        node = Node(s.name, s.tid, s.start_ns, s.end_ns, dict(s.args))
        pid = s.args["Python id"]
        assert pid not in by_id
        by_id[pid] = node
        parents[pid] = s.args["Python parent id"]
    for pid, parent in parents.items():
        if parent is not None:
            assert parent in by_id, f"span {pid} names a missing parent {parent}"
            by_id[parent].children.append(by_id[pid])
    return list(by_id.values())


def find(trace: Trace, qualname: str) -> list[Node]:
    """Spans of a function by qualified name (plain name on 3.10: code has no qualname there)."""
    if sys.version_info < (3, 11):
        qualname = qualname.rsplit(".", 1)[-1]
    return [n for n in nodes(trace) if n.short == qualname]


def assert_nested(all_nodes: list[Node]) -> None:
    """Children lie inside their parent in time, on the same thread, in start order."""
    for n in all_nodes:
        assert n.start <= n.end
        last = n.start
        for c in n.children:
            assert c.tid == n.tid
            assert n.start <= c.start and c.end <= n.end, (n.name, c.name)
            assert c.start >= last
            last = c.start


def test_recursion_gives_the_exact_call_tree(implementation: str) -> None:
    trace, ctx, _ = record(implementation, lambda: w.fib(6))
    fib_ids = {m.args["Python id"] for m in find(trace, "fib")}
    roots = [n for n in find(trace, "fib") if n.args["Python parent id"] not in fib_ids]
    assert len(roots) == 1
    top = roots[0]
    assert top.shape() == w.fib_shape(6)
    assert len(find(trace, "fib")) == 25  # fib(6) makes 25 calls
    assert top.name.startswith("tests/tracer_workloads.py(")
    assert_nested(nodes(trace))
    assert ctx.metadata["stepscope_python_tracer"]["dropped_events"] == 0


def test_generators_give_one_span_per_resumption(implementation: str) -> None:
    trace, _, _ = record(implementation, lambda: (w.consume(3), w.abandon()))
    (consume,) = find(trace, "consume")
    assert [c.short for c in consume.children] == ["counter"] * 4
    (abandon,) = find(trace, "abandon")
    # next() then close(): GeneratorExit is thrown in and unwinds the generator.
    assert [c.shape() for c in abandon.children] == [
        ("guarded", []),
        ("guarded", [("quick", [])]),
    ]
    assert_nested(nodes(trace))


def test_async_functions_are_balanced(implementation: str) -> None:
    trace, _, _ = record(implementation, lambda: w.run_async(3))
    all_nodes = nodes(trace)
    assert_nested(all_nodes)
    leaves = find(trace, "leaf")
    # Each coroutine runs in two segments: up to the sleep, then after it.
    assert len(leaves) == 6
    assert len(find(trace, "gather_leaves")) == 2  # before and after the gather
    for leaf in leaves:
        assert "Open at window end" not in leaf.args


def test_exceptions_and_sys_exit_unwind_balanced(implementation: str) -> None:
    def body() -> None:
        w.level1()
        with pytest.raises(SystemExit):
            w.quitter()

    trace, _, _ = record(implementation, body)
    (top,) = find(trace, "level1")
    assert top.shape() == ("level1", [("level2", [("level3", [])])])
    (quit_span,) = find(trace, "quitter")
    assert "Open at window end" not in quit_span.args
    assert_nested(nodes(trace))


def test_threads_started_and_ended_inside_the_window(implementation: str) -> None:
    seen: list[int] = []

    def in_thread() -> None:
        seen.append(threading.get_native_id())
        w.fib(3)

    def body() -> None:
        t = threading.Thread(target=in_thread)
        t.start()
        t.join()

    trace, _, _ = record(implementation, body)
    (tid,) = seen
    fibs = [n for n in find(trace, "fib") if n.tid == tid]
    assert len(fibs) == 5
    thread_nodes = [n for n in nodes(trace) if n.tid == tid]
    assert all("Open at window end" not in n.args for n in thread_nodes)
    assert_nested(thread_nodes)
    top_fib = [n for n in fibs if not any(n in m.children for m in fibs)]
    assert len(top_fib) == 1 and top_fib[0].shape() == w.fib_shape(3)


def test_threads_already_running_when_the_window_starts(implementation: str) -> None:
    if implementation == "python" and not PY312:
        pytest.skip("pure Python reaches running threads only on 3.12+")
    go = threading.Event()
    done = threading.Event()
    tids: list[int] = []

    def worker() -> None:
        tids.append(threading.get_native_id())
        go.wait(10)
        w.fib(4)
        done.set()
        go.wait(10)

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    while not tids:
        threading.Event().wait(0.001)

    def body() -> None:
        go.set()
        done.wait(10)

    try:
        trace, _, _ = record(implementation, body)
    finally:
        go.set()
        t.join(10)
    thread_nodes = [n for n in nodes(trace) if n.tid == tids[0]]
    (worker_span,) = [n for n in thread_nodes if n.short.endswith("worker")]
    assert worker_span.args.get("Open at window start") is True
    fibs = [c for c in worker_span.children if c.short == "fib"]
    assert len(fibs) == 1 and fibs[0].shape() == w.fib_shape(4)
    assert_nested(thread_nodes)


def test_frames_open_at_window_end_are_closed_and_flagged(implementation: str) -> None:
    collector = PythonTracerCollector(implementation=implementation, strict=True)
    ctx = WindowContext(window=0)
    collector.prepare(ctx)

    def inner() -> None:
        collector.stop(ctx)

    def outer() -> None:
        w.quick()
        inner()

    collector.start(ctx)
    outer()
    builder = TraceBuilder()
    collector.collect(builder, ctx)
    trace = builder.build()
    (o,) = find(trace, "test_frames_open_at_window_end_are_closed_and_flagged.<locals>.outer")
    assert o.args.get("Open at window end") is True
    assert "Open at window start" not in o.args
    assert [c.short.rsplit(".", 1)[-1] for c in o.children] == ["quick", "inner"]
    assert o.children[1].end == o.end  # both closed at the window end
    (test_frame,) = find(trace, "test_frames_open_at_window_end_are_closed_and_flagged")
    assert test_frame.args.get("Open at window start") is True
    assert test_frame.args.get("Open at window end") is True
    assert_nested(nodes(trace))


# -- filters ----------------------------------------------------------------------------------


def test_include_records_only_matching_modules(implementation: str) -> None:
    trace, _, _ = record(implementation, lambda: w.mixed(), include=("tests.tracer_workloads",))
    names = {n.name.split("(")[0] for n in nodes(trace)}
    assert names == {"tests/tracer_workloads.py"}
    (mixed,) = find(trace, "mixed")
    assert mixed.args["Python parent id"] is None


def test_exclude_skips_a_module_but_keeps_its_callees(implementation: str) -> None:
    def body() -> None:
        json.dumps({"a": [1, 2]}, default=lambda o: o)
        w.fib(2)

    trace, _, _ = record(implementation, body, exclude=("json", "tests.tracer_workloads"))
    assert not [n for n in nodes(trace) if n.name.startswith(("json/", "tests/tracer_workloads"))]
    assert find(trace, "test_exclude_skips_a_module_but_keeps_its_callees.<locals>.body")


def test_max_depth_limits_the_tree(implementation: str) -> None:
    trace, _, _ = record(implementation, lambda: w.fib(8), max_depth=4)
    all_nodes = nodes(trace)

    def depth(n: Node, parents: dict[int, Node]) -> int:
        d = 1
        while n.args["Python parent id"] is not None:
            n = parents[n.args["Python parent id"]]
            d += 1
        return d

    by_id = {n.args["Python id"]: n for n in all_nodes}
    assert max(depth(n, by_id) for n in all_nodes) == 4


def test_min_duration_keeps_only_long_calls(implementation: str) -> None:
    trace, _, _ = record(
        implementation,
        lambda: w.slow_and_quick(),
        min_duration_ns=5_000_000,
        include=("tests.tracer_workloads",),
    )
    assert [n.short for n in nodes(trace)] == ["slow_and_quick", "slow"]


def test_c_functions_are_opt_in(implementation: str) -> None:
    off, _, _ = record(implementation, lambda: w.consume(2))
    assert not [n for n in nodes(off) if n.name.startswith("<built-in")]
    on, _, _ = record(implementation, lambda: w.consume(2), trace_c_functions=True)
    (consume,) = find(on, "consume")
    names = [c.name for c in consume.children]
    assert "<built-in function sum>" in names
    assert_nested(nodes(on))


# -- budgets ----------------------------------------------------------------------------------


def _count_fib(implementation: str, **options: Any) -> tuple[Trace, WindowContext]:
    trace, ctx, _ = record(
        implementation, lambda: w.fib(10), include=("tests.tracer_workloads",), **options
    )
    return trace, ctx


def test_budget_newest_keeps_the_first_calls(
    implementation: str, caplog: pytest.LogCaptureFixture
) -> None:
    full, _ = _count_fib(implementation)
    total = len(full.spans)
    assert total == 177  # fib(10)
    with caplog.at_level(logging.WARNING, logger="stepscope"):
        trace, ctx = _count_fib(implementation, event_budget=50, drop_policy="newest")
    info = ctx.metadata["stepscope_python_tracer"]
    assert len(trace.spans) == 50 == info["events"]
    assert info["dropped_events"] == total - 50
    assert any("dropped 127 calls" in line for line in ctx.summary)
    assert sum("dropped" in r.getMessage() for r in caplog.records) == 1
    # The first calls in start order are kept, with all their ancestors.
    kept = nodes(trace)
    (top,) = [n for n in kept if n.args["Python parent id"] is None]
    assert top.short == "fib"
    # fib(10) -> fib(9) -> ... : the calls made first are the leftmost descent.
    depths = sorted(len(n.walk()) for n in kept)
    assert max(depths) == 50 or top.walk()[:10] == [(d, "fib") for d in range(10)]


def test_budget_oldest_keeps_the_last_calls(implementation: str) -> None:
    trace, ctx = _count_fib(implementation, event_budget=40, drop_policy="oldest")
    info = ctx.metadata["stepscope_python_tracer"]
    kept = len(trace.spans)
    # Whole chunks (budget // 8 = 5 records) are evicted at a time.
    assert 40 - 5 <= kept <= 40
    assert info["dropped_events"] == 177 - kept
    all_nodes = nodes(trace)  # every parent id resolves: ancestors close last
    (top,) = [n for n in all_nodes if n.args["Python parent id"] is None]
    assert top.short == "fib" and top.end == max(n.end for n in all_nodes)


def test_collector_warns_once_across_windows(caplog: pytest.LogCaptureFixture) -> None:
    collector = PythonTracerCollector(event_budget=5, include=("tests.tracer_workloads",))
    with caplog.at_level(logging.WARNING, logger="stepscope"):
        for window in range(2):
            ctx = WindowContext(window=window)
            collector.prepare(ctx)
            collector.start(ctx)
            w.fib(5)
            collector.stop(ctx)
            collector.collect(TraceBuilder(), ctx)
            assert ctx.metadata["stepscope_python_tracer"]["dropped_events"] > 0
    collector.close()
    assert sum("dropped" in r.getMessage() for r in caplog.records) == 1


# -- the two implementations agree --------------------------------------------------------


@pytest.mark.skipif(not HAS_NATIVE, reason="C extension not built")
@pytest.mark.parametrize("trace_c", [False, True])
def test_c_and_pure_python_give_the_same_tree(trace_c: bool) -> None:
    trees = []
    for implementation in ("native", "python"):
        trace, _, _ = record(implementation, lambda: w.mixed(), trace_c_functions=trace_c)
        (mixed,) = find(trace, "mixed")
        trees.append(mixed.walk())
    assert trees[0] == trees[1]
    assert len(trees[0]) > 40


# -- coexistence ------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_NATIVE, reason="C extension not built")
def test_cprofile_and_coverage_keep_working(tmp_path: Path) -> None:
    coverage = pytest.importorskip("coverage")
    cov = coverage.Coverage(data_file=None, config_file=False, include=[w.__file__])
    prof = cProfile.Profile()
    cov.start()
    prof.enable()
    try:
        trace, _, _ = record("native", lambda: w.fib(7))
        w.fib(3)  # after the window: cProfile must still be installed
    finally:
        prof.disable()
        cov.stop()
    fib_calls = [
        v
        for k, v in pstats.Stats(prof).stats.items()  # type: ignore[attr-defined]
        if k[2] == "fib"
    ]
    assert fib_calls[0][1] == 41 + 5  # primitive + recursive calls: fib(7) and fib(3)
    lines = cov.get_data().lines(str(Path(w.__file__).resolve()))
    assert lines is not None and w.fib.__code__.co_firstlineno + 2 in lines
    assert len(find(trace, "fib")) == 41


def test_nothing_stays_installed_after_stop(implementation: str) -> None:
    before = (sys.getprofile(), threading.getprofile())
    record(implementation, lambda: w.fib(3))
    assert (sys.getprofile(), threading.getprofile()) == before
    if PY312:
        tools = [sys.monitoring.get_tool(t) for t in range(6)]  # type: ignore[attr-defined]
        assert "stepscope" not in tools


@pytest.mark.skipif(not (HAS_NATIVE and PY312), reason="sys.monitoring path")
def test_changed_filters_restart_disabled_events() -> None:
    excluded, _, _ = record("native", lambda: w.fib(4), exclude=("tests.tracer_workloads",))
    assert not find(excluded, "fib")
    included, _, _ = record("native", lambda: w.fib(4))
    assert len(find(included, "fib")) == 9


def test_only_one_collector_traces_at_a_time() -> None:
    a = PythonTracerCollector()
    b = PythonTracerCollector()
    ctx = WindowContext(window=0)
    a.prepare(ctx)
    try:
        with pytest.raises(RuntimeError, match="only one profile"):
            b.prepare(ctx)
    finally:
        a.close()
    b.prepare(ctx)
    b.close()


# -- output ------------------------------------------------------------------------------------


def test_chrome_trace_round_trip(tmp_path: Path) -> None:
    trace, _, _ = record("native" if HAS_NATIVE else "python", lambda: w.fib(4))
    path = tmp_path / "t.json"
    write_chrome_trace(trace, path)
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    fibs = [e for e in events if e["name"].endswith(": fib")]
    assert len(fibs) == 9
    assert all(e["cat"] == "python_function" for e in events)
    # Ids stay in memory (the file's nesting carries the same tree); only the spans open at
    # the window's edges carry args in the file, with their flags.
    flagged = [e for e in events if "args" in e]
    assert flagged and all(
        "Open at window start" in e["args"] or "Open at window end" in e["args"] for e in flagged
    )
    assert all(n.args["Python id"] for n in nodes(trace))
    again = read_chrome_trace(path)
    assert len(again.spans) == len(trace.spans)


def test_source_names_shorten_like_torch(tmp_path: Path) -> None:
    site = tmp_path / "lib" / "site-packages"
    pkg = site / "pkg"
    pkg.mkdir(parents=True)
    names = SourceNames([str(tmp_path / "lib"), str(site)])
    assert names.short_path(str(pkg / "mod.py")) == "pkg/mod.py"
    assert names.module(str(pkg / "mod.py")) == "pkg.mod"
    assert names.module(str(pkg / "__init__.py")) == "pkg"
    assert names.module("<frozen importlib._bootstrap>") == "importlib._bootstrap"
    assert names.short_path("/elsewhere/x.py") == "/elsewhere/x.py"
    assert names.module("/elsewhere/x.py") == "x"
    code = compile("def f(): pass", str(pkg / "mod.py"), "exec").co_consts[0]
    assert names.span_name(code) == "pkg/mod.py(1): f"


def test_module_globs_match_packages_and_submodules() -> None:
    f = ModuleFilter(("torch",), ("torch.nn.*",), SourceNames([]))
    assert f.module_included("torch")
    assert f.module_included("torch.autograd.profiler")
    assert not f.module_included("torch.nn.modules")
    assert f.module_included("torch.nn")  # "torch.nn.*" names submodules only
    assert not f.module_included("numpy")


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"max_depth": 0}, ValueError),
        ({"drop_policy": "random"}, ValueError),
        ({"event_budget": 0}, ValueError),
        ({"min_duration_ns": -1}, ValueError),
        ({"buffer_bytes": 3}, ValueError),
        ({"include": "torch"}, TypeError),
    ],
)
def test_bad_options_are_explained(options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        TracerOptions(**options)
    with pytest.raises(error):
        PythonTracerCollector(**options)


def test_unknown_implementation_is_rejected() -> None:
    with pytest.raises(ValueError, match="implementation must be one of"):
        PythonTracerCollector(implementation="fast")


def test_profile_with_stack_records_python_spans() -> None:
    stepscope = pytest.importorskip("stepscope")
    sched = stepscope.schedule(wait=0, warmup=1, active=2, repeat=1)
    with stepscope.profile(with_stack=True, schedule=sched) as prof:
        for _ in range(4):
            w.fib(5)
            prof.step()
    (trace,) = prof.traces
    assert trace.metadata["stepscope_python_tracer"]["dropped_events"] == 0
    fibs = find(trace, "fib")
    assert len(fibs) == 30  # fib(5) in each of the two recorded steps
    rows = {row.key: row.count for row in prof.key_averages()}
    assert rows[fibs[0].name] == 30
