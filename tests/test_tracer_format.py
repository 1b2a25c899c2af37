"""The function tracer's written traces: smaller, and still the same spans for every reader.

Spans keep their ``Python id`` / ``Python parent id`` in memory as columns; the file leaves them
out (the nesting carries the same tree).  Checked against the previous format (the same trace
with a dict of args per span), Perfetto's strict-nesting rule for ``X`` slices, HTA's call graph
and stepscope's reader.
"""

from __future__ import annotations

import json
import logging
import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tests.tracer_workloads as w
from stepscope._ext import native
from stepscope.trace.chrome_reader import read_chrome_trace
from stepscope.trace.chrome_writer import write_chrome_trace
from stepscope.trace.model import Trace, TraceBuilder
from tests.test_tracer import record as record_window

# C-part tests (`-m native`): also run under Python 3.12 and 3.13 by `make test-monitoring`.
pytestmark = pytest.mark.native

Key = tuple[str, str, int | str, int | str, int, int]


def workload() -> None:
    """Recursion, a generator, an exception, a method-heavy loop and a second thread."""
    worker = threading.Thread(target=w.fib, args=(6,))
    worker.start()
    w.fib(9)
    w.consume(5)
    w.level1()
    w.areas(50)
    worker.join()


def record(implementation: str) -> Trace:
    builder = TraceBuilder()
    builder.distributed_info = {"rank": 0}
    return record_window(implementation, workload, builder=builder)[0]


def with_args_per_span(trace: Trace) -> Trace:
    """The same trace in the previous representation: a dict of args on every span."""
    b = TraceBuilder(base_time_ns=trace.base_time_ns)
    b.distributed_info = trace.distributed_info
    for s in trace.iter_spans():
        b.span(s.name, s.cat, s.pid, s.tid, s.start_ns, s.dur_ns, dict(s.args or {}))
    return b.build()


def keys(trace: Trace) -> list[Key]:
    """Every span with its absolute start (a file's base is a whole second)."""
    base = trace.base_time_ns
    return sorted(
        (s.name, s.cat, s.pid, s.tid, base + s.start_ns, s.dur_ns) for s in trace.iter_spans()
    )


def parent_names_by_ids(trace: Trace) -> Counter[tuple[str, str | None]]:
    """(span, its parent's name) from the in-memory Python ids."""
    spans = list(trace.iter_spans())
    by_id = {s.args["Python id"]: s.name for s in spans if s.args}
    return Counter(
        (s.name, by_id.get(s.args["Python parent id"]) if s.args else None) for s in spans
    )


def strict_nesting_parents(events: list[dict[str, Any]]) -> Counter[tuple[str, str | None]]:
    """Perfetto's JSON import rule: on a track, each ``X`` slice ends inside the slice open
    when it begins; (span, parent's name) by that rule (raises on a partial overlap)."""
    out: Counter[tuple[str, str | None]] = Counter()
    tracks: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for track in tracks.values():
        track.sort(key=lambda e: (e["ts"], -e["dur"]))  # stable: file order breaks ties
        stack: list[dict[str, Any]] = []
        for e in track:
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] and e["dur"] > 0:
                stack.pop()
            if stack:
                top = stack[-1]
                assert e["ts"] + e["dur"] <= top["ts"] + top["dur"] + 1e-9, (e, top)
            out[(e["name"], stack[-1]["name"] if stack else None)] += 1
            stack.append(e)
    return out


@pytest.fixture(scope="module", params=["native", "python"])
def written(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Trace, Path, Path]:
    """A recorded trace, written in the new format and in the previous one."""
    if request.param == "native" and native() is None:
        pytest.skip("the C extension is not in use")
    trace = record(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    new, old = folder / "new" / "rank0.json", folder / "old" / "rank0.json"
    new.parent.mkdir()
    old.parent.mkdir()
    write_chrome_trace(trace, new)
    write_chrome_trace(with_args_per_span(trace), old)
    return trace, new, old


def test_same_spans_in_fewer_bytes(written: tuple[Trace, Path, Path]) -> None:
    trace, new, old = written
    back_new, back_old = read_chrome_trace(new), read_chrome_trace(old)
    assert keys(back_new) == keys(back_old) == keys(trace)
    assert len(trace.spans) > 100
    # every span but those open at the window's edges drops its args in the file
    events = [e for e in json.loads(new.read_text())["traceEvents"] if e["ph"] == "X"]
    flagged = [e for e in events if "args" in e]
    edges = ("Open at window start", "Open at window end")
    open_at_edges = [s for s in trace.iter_spans() if s.args and any(k in s.args for k in edges)]
    assert 0 < len(flagged) == len(open_at_edges) < len(events) // 4
    saved = old.stat().st_size - new.stat().st_size
    assert saved >= 40 * (len(events) - len(flagged))  # '"args":{"Python id":..,..}' each


def test_file_nesting_is_the_tree_of_the_python_ids(written: tuple[Trace, Path, Path]) -> None:
    trace, new, _ = written
    events = [e for e in json.loads(new.read_text())["traceEvents"] if e["ph"] == "X"]
    assert strict_nesting_parents(events) == parent_names_by_ids(trace)


def hta_parents(path: Path) -> Counter[tuple[str, str | None]]:
    """(span, parent's name) from HTA's call graph of the trace in ``path``'s folder."""
    call_stack = pytest.importorskip("hta.common.call_stack")
    hta = pytest.importorskip("hta.trace_analysis")
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            analysis = hta.TraceAnalysis(trace_dir=str(path.parent))
            call_stack.CallGraph(analysis.t, ranks=[0])
    finally:
        logging.disable(logging.NOTSET)
    df = analysis.t.get_trace(0)
    symbols = analysis.t.symbol_table.get_sym_table()
    names = {int(i): symbols[int(n)] for i, n in zip(df["index"], df["name"], strict=True)}
    found: Counter[tuple[str, str | None]] = Counter()
    for i, parent in zip(df["index"], df["parent"], strict=True):
        found[(names[int(i)], names.get(int(parent)) if parent >= 0 else None)] += 1
    return found


def test_hta_reads_the_same_call_graph_as_from_the_previous_format(
    written: tuple[Trace, Path, Path],
) -> None:
    trace, new, old = written
    found = hta_parents(new)
    assert found == hta_parents(old)
    # every span is there (HTA keeps whole microseconds, so sub-microsecond calls may hang off
    # a neighbour in its graph, from either format alike)
    assert found.total() == len(trace.spans)
