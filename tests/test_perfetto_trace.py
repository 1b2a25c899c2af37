"""Our ``.pftrace`` decoded with Perfetto's official definitions, against the same window's Chrome
JSON (read with ``json`` alone): every slice's name, thread, begin and end (ns), nesting,
counters and flows."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from stepscope.cli import main

pb = pytest.importorskip(
    "perfetto.protos.perfetto.trace.perfetto_trace_pb2",
    reason="the perfetto extra (pip install 'stepscope[perfetto]') decodes .pftrace",
)
SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"


def ns(doc: dict[str, Any], us: Any) -> int:
    return int(doc.get("baseTimeNanoseconds", 0)) + int(Decimal(str(us)) * 1000)


def decoded(path: Path) -> tuple[list[tuple[Any, ...]], Counter[Any], dict[int, list[Any]]]:
    """(slices (name, pid, tid, begin, end, parent index), counter points, flow id -> ends)."""
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    names: dict[int, str] = {}
    tracks: dict[int, Any] = {}
    for packet in trace.packet:
        for n in packet.interned_data.event_names:
            names[n.iid] = n.name
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
            slices.append([names[ev.name_iid], pid, tid, ts, None, stack[-1] if stack else None])
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
    out = tmp_path / f"{name}.pftrace"
    assert main(["convert", str(local), "--to", "perfetto", "-o", str(out)]) == 0
    doc = json.loads(gzip.decompress(local.read_bytes()))
    events = doc["traceEvents"]
    slices, counters, flows = decoded(out)

    spans = [e for e in events if e.get("ph") == "X"]
    want = Counter(
        (
            e.get("name", ""),
            e["pid"],
            e["tid"],
            ns(doc, e["ts"]),
            ns(doc, e["ts"]) + int(Decimal(str(e.get("dur", 0))) * 1000),
        )
        for e in spans
    )
    got = Counter(s[:5] for s in slices)
    # a track named by a string label compares as text
    want = Counter(
        {
            key if key in got else (key[0], str(key[1]), str(key[2]), *key[3:]): c
            for key, c in want.items()
        }
    )
    assert got == want
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
