"""Our ``.pftrace`` decoded with Perfetto's official definitions, against the same window's Chrome
JSON (read with ``json`` alone): every slice's name, thread, begin and end (ns), nesting and
args, counters and flows; a sampled window's flame chart too."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.cli import main
from stepscope.trace.chrome_writer import write_chrome_trace
from stepscope.trace.sampled_spans import SAMPLED_CATEGORY, SAMPLED_TID_BASE

pb = pytest.importorskip(
    "perfetto.protos.perfetto.trace.perfetto_trace_pb2",
    reason="the perfetto extra (pip install 'stepscope[perfetto]') decodes .pftrace",
)
SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"


def ns(doc: dict[str, Any], us: Any) -> int:
    return int(doc.get("baseTimeNanoseconds", 0)) + int(Decimal(str(us)) * 1000)


def value_of(ann: Any) -> Any:
    """A debug annotation's value as the JSON value it was written from."""
    kind = ann.WhichOneof("value")
    if kind == "legacy_json_value":
        return json.loads(ann.legacy_json_value)
    if kind is not None:
        return getattr(ann, kind)
    if ann.dict_entries:
        return {e.name: value_of(e) for e in ann.dict_entries}
    return [value_of(a) for a in ann.array_values]


def debug_args(ev: Any, arg_names: dict[int, str]) -> dict[str, Any]:
    return {arg_names[a.name_iid]: value_of(a) for a in ev.debug_annotations}


def decoded(path: Path) -> tuple[list[tuple[Any, ...]], Counter[Any], dict[int, list[Any]]]:
    """(slices (name, pid, tid, begin, end, parent index, args), counter points, flow id ->
    ends)."""
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    names: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    tracks: dict[int, Any] = {}
    for packet in trace.packet:
        for n in packet.interned_data.event_names:
            names[n.iid] = n.name
        for n in packet.interned_data.debug_annotation_names:
            arg_names[n.iid] = n.name
        if packet.HasField("track_descriptor"):
            tracks[packet.track_descriptor.uuid] = packet.track_descriptor

    def thread_of(uuid: int) -> tuple[Any, Any] | None:
        """(pid, tid) of a thread track or its lane; a string label's track is named by it."""
        desc = tracks[uuid]
        while not desc.HasField("thread"):
            parent = tracks.get(desc.parent_uuid)
            if parent is None:
                return None
            if not parent.HasField("thread") and parent.parent_uuid in tracks:
                process = tracks[parent.parent_uuid]
                return str(process.process.pid or process.name), parent.name
            if parent.HasField("process") or (parent.name and not parent.parent_uuid):
                return str(parent.process.pid or parent.name), desc.name
            desc = parent
        return desc.thread.pid, desc.thread.tid

    slices: list[list[Any]] = []
    open_: dict[int, list[int]] = {}
    counters: Counter[Any] = Counter()
    flows: dict[int, list[Any]] = {}
    for packet in trace.packet:
        if not packet.HasField("track_event"):
            continue
        ev, ts = packet.track_event, packet.timestamp
        stack = open_.setdefault(ev.track_uuid, [])
        if ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            pid, tid = thread_of(ev.track_uuid) or (None, None)
            slices.append(
                [
                    names[ev.name_iid],
                    pid,
                    tid,
                    ts,
                    None,
                    stack[-1] if stack else None,
                    debug_args(ev, arg_names),
                ]
            )
            stack.append(len(slices) - 1)
            for fid in [*ev.flow_ids, *ev.terminating_flow_ids]:
                flows.setdefault(fid, []).append((pid, tid, ts, "slice", len(slices) - 1))
        elif ev.type == pb.TrackEvent.TYPE_SLICE_END:
            slices[stack.pop()][4] = ts
        elif ev.type == pb.TrackEvent.TYPE_COUNTER:
            counters[(tracks[ev.track_uuid].name, ts, ev.double_counter_value)] += 1
        elif ev.type == pb.TrackEvent.TYPE_INSTANT:
            pid, tid = thread_of(ev.track_uuid) or (None, None)
            for fid in [*ev.flow_ids, *ev.terminating_flow_ids]:
                flows.setdefault(fid, []).append((pid, tid, ts, "instant", None))
    assert not any(open_.values())
    return [tuple(s) for s in slices], counters, flows


@pytest.mark.parametrize("name", ["alexnet_gpu", "cpu_only"])
def test_pftrace_matches_the_chrome_json(name: str, tmp_path: Path) -> None:
    source = SHARED / f"{name}.json.gz"
    if not source.exists():
        pytest.skip(f"{source} is not here")
    local = tmp_path / source.name
    shutil.copy(source, local)
    assert_pftrace_matches(local, tmp_path)


def test_window_with_memory_counters_and_flows_matches(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with stepscope.profile(profile_memory=True, record_shapes=True) as prof:
        for _ in range(2):
            model(torch.randn(8, 16)).sum().backward()
            prof.step()
    trace = prof.trace()
    assert len(trace.counters) and len(trace.flows), trace
    local = tmp_path / "window.json.gz"
    write_chrome_trace(trace, local)
    counters = assert_pftrace_matches(local, tmp_path)
    assert sum(counters.values()) >= len(trace.counters)


def test_sampled_window_keeps_its_flame_chart_and_args(tmp_path: Path) -> None:
    """Stack samples are written as the Chrome file shows them (a flame chart per sampled
    thread); annotations' args, with nested values, become debug annotations."""

    def spin(n: int) -> int:
        return sum(i * i for i in range(n))

    with stepscope.profile(
        activities=["CPU", "SAMPLING"], torch_ops=False, sampling_rate_hz=1000
    ) as prof:
        for step in range(3):
            with stepscope.record_function(
                "work", args={"step": step, "sizes": [1, 2.5], "n": None}
            ):
                spin(200_000)
            prof.step()
    trace = prof.trace()
    assert len(trace.samples), "the sampler took no sample"
    local = tmp_path / "sampled.json.gz"
    write_chrome_trace(trace, local)
    assert_pftrace_matches(local, tmp_path)
    slices, _, _ = decoded(tmp_path / f"{local.name}.pftrace")
    assert "work" in {s[0] for s in slices}
    assert any(s[0].endswith("spin") for s in slices)  # a sampled frame, on the flame chart
    assert {"step": 2, "sizes": [1, 2.5], "n": None} in [s[6] for s in slices if s[0] == "work"]


def assert_pftrace_matches(local: Path, tmp_path: Path) -> Counter[Any]:
    """Convert ``local`` (a ``.json.gz``) to ``.pftrace`` and check it against the JSON; returns
    the counter points decoded."""
    out = tmp_path / f"{local.name}.pftrace"
    assert main(["convert", str(local), "--to", "perfetto", "-o", str(out)]) == 0
    doc = json.loads(gzip.decompress(local.read_bytes()))
    events = doc["traceEvents"]
    slices, counters, flows = decoded(out)

    spans = [e for e in events if e.get("ph") == "X"]

    def thread(e: dict[str, Any]) -> Any:
        """A sampled flame chart's track is a child of its thread's track in Perfetto."""
        tid = e["tid"]
        return tid - SAMPLED_TID_BASE if e.get("cat") == SAMPLED_CATEGORY else tid

    want = Counter(
        (
            e.get("name", ""),
            e["pid"],
            thread(e),
            ns(doc, e["ts"]),
            ns(doc, e["ts"]) + int(Decimal(str(e.get("dur", 0))) * 1000),
            json.dumps(e.get("args", {}), sort_keys=True),
        )
        for e in spans
    )
    got = Counter((*s[:5], json.dumps(s[6], sort_keys=True)) for s in slices)
    # a track named by a string label compares as text
    want = Counter(
        {
            key if key in got else (key[0], str(key[1]), str(key[2]), *key[3:]): c
            for key, c in want.items()
        }
    )
    assert got == want
    assert any(s[6] for s in slices) == any(e.get("args") for e in spans)
    for s in slices:  # nesting: a parent holds its child, on the same thread
        if s[5] is not None:
            parent = slices[s[5]]
            assert parent[1:3] == s[1:3] and parent[3] <= s[3] and s[4] <= parent[4]

    want_counters: Counter[Any] = Counter()
    for e in events:
        if e.get("ph") == "C":
            for series, value in e["args"].items():
                label = e["name"] if series == e["name"] else f"{e['name']}.{series}"
                want_counters[(label, ns(doc, e["ts"]), float(value))] += 1
    assert counters == want_counters

    for e in events:
        if e.get("ph") in ("s", "t", "f"):
            ends = flows[int(e["id"])]
            ts = ns(doc, e["ts"])
            assert any(
                (p, t) == (e["pid"], e["tid"])
                and (ts == at if kind == "instant" else slices[i][3] <= ts <= slices[i][4])
                for p, t, at, kind, i in ends
            ), e
    return counters


def test_times_before_the_epoch_are_one_line_and_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Perfetto's timestamps are unsigned: a trace with an event before 0 is refused."""
    source = tmp_path / "early.json"
    source.write_text('{"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":-5,"dur":3}]}')
    out = tmp_path / "early.pftrace"
    assert main(["convert", str(source), "--to", "perfetto", "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Perfetto's timestamps are unsigned" in err
    assert not out.exists() and list(tmp_path.iterdir()) == [source]
