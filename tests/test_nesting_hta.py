"""Parents from ``nest_spans`` (the C part or its twin, as the process chooses) against HTA's
call graph on shared real GPU traces: every CPU span HTA parsed has the parent HTA gives it.

The one difference is a boundary rule: a zero-length span that starts exactly where a span ends
is inside it for HTA and after it here (a span covers its start up to, not including, its end).
"""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepscope.trace import read_chrome_trace
from stepscope.trace.model import Trace
from stepscope.trace.nesting import nest_spans
from tests.analysis_helpers import SHARED

pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason="shared GPU traces not present")

TRACES = ["simple_add_gpu.json.gz", "alexnet_gpu.json.gz", "cupti_counters_gpu.json.gz"]
"""The shared traces whose times HTA keeps as written (microseconds), so rows match spans."""


@pytest.fixture(autouse=True)
def _quiet_hta() -> Iterator[None]:
    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    logging.disable(logging.NOTSET)


def hta_cpu_rows(path: Path) -> tuple[Any, list[str]]:
    """HTA's rows of the trace with its ``parent`` column (by the call graph), and its names."""
    trace_module = pytest.importorskip("hta.common.trace")
    call_stack = pytest.importorskip("hta.common.call_stack")
    hta_trace = trace_module.Trace(trace_files={0: str(path)}, trace_dir=str(path.parent))
    hta_trace.parse_traces()
    call_stack.CallGraph(hta_trace)  # adds "parent" to the rank's rows
    return hta_trace.get_trace(0), hta_trace.symbol_table.get_sym_table()


def span_keys(trace: Trace) -> dict[tuple[object, ...], int]:
    """(pid, tid, start ns, dur ns, name) -> span index, for keys that name one span only."""
    spans = trace.spans
    found: dict[tuple[object, ...], int] = {}
    twice: set[tuple[object, ...]] = set()
    for i, (pid, tid, start, dur, name) in enumerate(
        zip(*(spans[c] for c in ("pid", "tid", "start_ns", "dur_ns", "name")), strict=True)
    ):
        key = (trace.label(pid), trace.label(tid), start, dur, trace.string(name))
        if key in found:
            twice.add(key)
        found[key] = i
    return {k: i for k, i in found.items() if k not in twice}


@pytest.mark.parametrize("name", TRACES)
def test_parents_match_htas_call_graph(name: str, tmp_path: Path) -> None:
    copy = tmp_path / name
    shutil.copyfile(SHARED / name, copy)
    rows, names = hta_cpu_rows(copy)
    trace = read_chrome_trace(copy)
    parent = nest_spans(trace).parent
    keys = span_keys(trace)
    by_index = {int(r.index): r for r in rows.itertuples()}

    def span_of(row: Any) -> int | None:
        key = (int(row.pid), int(row.tid), round(row.ts * 1000), round(row.dur * 1000))
        return keys.get((*key, names[int(row.name)]))

    cpu = [r for r in rows.itertuples() if r.stream == -1]  # device rows' parent is their launch
    compared = boundary = 0
    for row in cpu:
        i = span_of(row)
        hta_parent = by_index.get(int(row.parent))
        if i is None or (hta_parent is not None and span_of(hta_parent) is None):
            continue
        expected = -1 if hta_parent is None else span_of(hta_parent)
        if row.dur == 0 and hta_parent is not None and hta_parent.ts + hta_parent.dur == row.ts:
            boundary += 1
            assert parent[i] != expected
            continue
        assert parent[i] == expected, (names[int(row.name)], row.ts)
        compared += 1
    assert compared >= 0.9 * len(cpu)  # nearly every CPU row is matched to one span
    assert boundary <= 0.05 * len(cpu)
