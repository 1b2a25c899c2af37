"""Counter sets: increments, resets, cached-metric deltas, threads, the trace collector."""

from __future__ import annotations

import json
import multiprocessing
import pickle
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from stepscope import counters
from stepscope.collectors.base import WindowContext
from stepscope.collectors.counters import CounterCollector
from stepscope.counters import CounterSet, Number
from stepscope.trace import TraceBuilder
from stepscope.trace.chrome_reader import read_chrome_trace
from stepscope.trace.chrome_writer import write_chrome_trace


def test_inc_get_snapshot() -> None:
    cs = CounterSet("t", counters=["generated_kernel_count", "num_bytes_accessed"])
    assert cs.snapshot() == {"generated_kernel_count": 0, "num_bytes_accessed": 0}
    cs.inc("generated_kernel_count")
    cs.inc("generated_kernel_count", 2)
    cs.inc("num_bytes_accessed", 4096)
    cs.inc("ir_nodes_pre_fusion", 0.5)
    assert cs.get("generated_kernel_count") == 3
    assert cs.get("never_used") == 0
    assert cs.snapshot() == {
        "generated_kernel_count": 3,
        "num_bytes_accessed": 4096,
        "ir_nodes_pre_fusion": 0.5,
    }
    assert cs.names() == ["generated_kernel_count", "num_bytes_accessed", "ir_nodes_pre_fusion"]


def test_reset_zeroes_every_counter_including_other_threads() -> None:
    cs = CounterSet("t")
    cs.inc("a", 5)
    worker = threading.Thread(target=lambda: cs.inc("b", 7))
    worker.start()
    worker.join()
    cs.reset()
    assert cs.snapshot() == {"a": 0, "b": 0}
    cs.inc("a")
    assert cs.snapshot() == {"a": 1, "b": 0}


def test_bad_names_and_amounts_are_type_errors() -> None:
    cs = CounterSet("t")
    with pytest.raises(TypeError, match="counter 'x': the amount must be an int or float, got str"):
        cs.inc("x", "1")  # type: ignore[arg-type]
    cs.inc("x")
    with pytest.raises(
        TypeError, match="counter 'x': the amount must be an int or float, got NoneType"
    ):
        cs.inc("x", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="the amount must be an int or float, got bool"):
        cs.inc("y", True)
    with pytest.raises(TypeError, match="counter names must be non-empty str, got int"):
        cs.inc(3)  # type: ignore[arg-type]
    assert cs.snapshot() == {"x": 1}


def test_cached_metrics_delta_replayed_on_a_cache_hit() -> None:
    cs = CounterSet("inductor", ["generated_kernel_count", "num_bytes_accessed", "cache_hits"])
    cs.inc("generated_kernel_count", 10)  # earlier work, not part of the delta
    before = cs.snapshot()
    cs.inc("generated_kernel_count", 3)  # the compiled graph's work
    cs.inc("num_bytes_accessed", 1024)
    stored = cs.delta(before)
    assert stored == {"generated_kernel_count": 3, "num_bytes_accessed": 1024}
    assert cs.delta(before, names=["num_bytes_accessed"]) == {"num_bytes_accessed": 1024}
    # the delta is stored next to the cached result (any serialisation) and applied on a hit
    restored = json.loads(json.dumps(stored))
    assert pickle.loads(pickle.dumps(stored)) == stored
    cs.reset()
    cs.inc("cache_hits")
    cs.apply(restored)
    assert cs.snapshot() == {
        "generated_kernel_count": 3,
        "num_bytes_accessed": 1024,
        "cache_hits": 1,
    }


def test_delta_and_apply_reject_wrong_types() -> None:
    cs = CounterSet("t")
    with pytest.raises(TypeError, match=r"delta\(since=...\) takes a snapshot\(\) mapping"):
        cs.delta(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="counter 'a': the amount must be an int or float"):
        cs.apply({"a": 1, "b": 2} | {"a": "x"})  # type: ignore[dict-item]
    assert cs.snapshot() == {}  # nothing applied when any entry is bad
    with pytest.raises(TypeError, match="apply\\(\\) takes a delta mapping, got list"):
        cs.apply([("a", 1)])  # type: ignore[arg-type]


def test_concurrent_increments_are_exact() -> None:
    cs = CounterSet("t")
    per_thread, threads = 20_000, 8
    barrier = threading.Barrier(threads)

    def work() -> None:
        barrier.wait()
        for _ in range(per_thread):
            cs.inc("hits")
            cs.inc("bytes", 3)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    seen = [cs.get("hits") for _ in range(50)]  # reads while writers run
    for w in workers:
        w.join()
    assert seen == sorted(seen)
    assert cs.snapshot() == {"hits": per_thread * threads, "bytes": 3 * per_thread * threads}


def test_reset_racing_with_increments_loses_nothing() -> None:
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible to provoke races
    try:
        _reset_race()
    finally:
        sys.setswitchinterval(old_interval)


def _reset_race() -> None:
    cs = CounterSet("t")
    per_thread, threads = 30_000, 3

    def count() -> None:
        for _ in range(per_thread):
            cs.inc("n")

    workers = [threading.Thread(target=count) for _ in range(threads)]
    for w in workers:
        w.start()
    cleared: int | float = 0
    while any(w.is_alive() for w in workers):
        cleared += cs.reset().get("n", 0)  # each increment lands before or after a reset
    for w in workers:
        w.join()
    final = cs.get("n")
    assert cleared + final == per_thread * threads
    assert cs.reset() == {"n": final}
    assert cs.snapshot() == {"n": 0}


def test_finished_threads_are_folded_and_still_counted() -> None:
    cs = CounterSet("t")
    for _ in range(50):
        t = threading.Thread(target=lambda: cs.inc("done"))
        t.start()
        t.join()
    assert cs.get("done") == 50
    assert cs.snapshot() == {"done": 50}
    assert len(cs._shards) <= 1  # only live threads keep a shard (none here, or main's)
    cs.inc("done")
    assert cs.snapshot() == {"done": 51}


def _child_counts(cs: CounterSet, queue: Any) -> None:
    cs.inc("x", 5)
    queue.put(cs.snapshot())


def test_a_forked_child_counts_on_its_own_copy() -> None:
    cs = counters.counter_set("forked")
    cs.inc("x", 1)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_counts, args=(cs, queue))
    child.start()
    got = queue.get(timeout=30)
    child.join(30)
    assert got == {"x": 6}
    assert cs.snapshot() == {"x": 1}


def test_named_sets_and_the_default_set() -> None:
    a = counters.counter_set("compile", ["graphs"])
    assert counters.counter_set("compile") is a
    assert a in counters.counter_sets() and counters.default in counters.counter_sets()
    assert a.snapshot()["graphs"] == 0
    saved = counters.snapshot()
    counters.inc("requests", 2)
    assert counters.get("requests") == saved.get("requests", 0) + 2
    assert counters.delta(saved) == {"requests": 2}
    counters.reset()
    assert counters.get("requests") == 0


def test_counters_feed_any_emit_callable() -> None:
    a = CounterSet("io", ["reads"])
    b = CounterSet("net")
    a.inc("reads", 3)
    b.inc("sent", 1.5)
    emitted: list[tuple[str, Number]] = []
    assert counters.emit_counters(lambda name, value: emitted.append((name, value)), [a, b]) == 2
    assert emitted == [("io.reads", 3), ("net.sent", 1.5)]
    assert counters.counter_pairs([a]) == [("io.reads", 3)]
    assert a.pairs() == [("reads", 3)]


# -- counter tracks in traces ---------------------------------------------------------------


def test_collector_writes_counter_tracks(tmp_path: Path) -> None:
    compile_set = CounterSet("compile", ["graphs"])
    io_set = CounterSet("io")
    io_set.inc("bytes", 100)
    collector = CounterCollector([compile_set, io_set])
    ctx = WindowContext(window=0)
    collector.prepare(ctx)
    collector.on_step(ctx, 0)  # not recording yet: ignored
    collector.start(ctx)
    compile_set.inc("graphs")
    io_set.inc("bytes", 50)
    collector.on_step(ctx, 1)
    compile_set.inc("graphs", 2)
    collector.stop(ctx)
    compile_set.inc("graphs", 100)  # after the window: not in the trace
    builder = TraceBuilder()
    collector.collect(builder, ctx)
    trace = builder.build()
    events = list(trace.iter_counter_events())
    assert [(e.name, e.values) for e in events] == [
        ("counters.compile", {"graphs": 0.0}),
        ("counters.io", {"bytes": 100.0}),
        ("counters.compile", {"graphs": 1.0}),
        ("counters.io", {"bytes": 150.0}),
        ("counters.compile", {"graphs": 3.0}),
        ("counters.io", {"bytes": 150.0}),
    ]
    assert {e.pid for e in events} == {ctx.pid}
    times = [e.ts_ns for e in events]
    assert times == sorted(times) and times[0] < times[-1]
    assert ctx.metadata["stepscope_counters"] == {"compile": {"graphs": 3}, "io": {"bytes": 50}}
    # the tracks survive a Chrome trace file
    path = tmp_path / "t.json"
    write_chrome_trace(trace, path)
    back = [(e.name, e.values) for e in read_chrome_trace(path).iter_counter_events()]
    assert back == [(e.name, e.values) for e in events]


def test_collector_samples_all_shared_sets_by_default_and_bounds_samples() -> None:
    shared = counters.counter_set("collector_default", ["x"])
    collector = CounterCollector(max_samples=3)
    ctx = WindowContext(window=0)
    collector.start(ctx)
    for step in range(5):
        shared.inc("x")
        collector.on_step(ctx, step)
    collector.stop(ctx)
    builder = TraceBuilder()
    collector.collect(builder, ctx)
    names = {e.name for e in builder.build().iter_counter_events()}
    assert {"counters.collector_default", "counters.default"} <= names
    values = [
        e.values["x"]
        for e in builder.build().iter_counter_events()
        if e.name == "counters.collector_default"
    ]
    assert values[0] + 5 == values[-1] and len(values) == 3  # start, first step, stop
    assert ctx.metadata["stepscope_counter_samples_dropped"] == 4
    assert ctx.summary == ["4 counter samples dropped (max_samples=3)"]


def test_collector_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_samples must be an int >= 2"):
        CounterCollector(max_samples=1)
    with pytest.raises(TypeError, match="sets must be CounterSet objects"):
        CounterCollector(["default"])  # type: ignore[list-item]
