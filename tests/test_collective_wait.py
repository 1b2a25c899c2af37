"""Collective wait in the step tables (issue 40, part 1) and the rank ``stepscope fleet`` says
the others waited for.

Checked against measurements made in the same run: two gloo ranks in one process (two threads,
each its own process group over one in-memory store, so the collectives go through torch's
dispatcher as DDP's do) time their own all-reduces, and the profiled thread's ``collective_ns``
must match; the fault-injection jobs (``tests/straggler_job.py``, torchrun) time the work they
inject, and the fleet must name that rank, the phase and the step it began, with the others'
wait as long as the injected work.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from stepscope.collectors import collective_hook
from stepscope.failures import failure_counts
from stepscope.steptables import StepTables
from tests.metrics_fixtures import free_port
from tests.test_ranks import ROOT, TORCHRUN, stepscope_cli

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("duckdb")
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

JOB = ROOT / "tests" / "straggler_job.py"
SLICE_NS = 4_000_000
"""One scheduler slice on a loaded 2-core machine: a preemption between the hook's clock reading
and the test's falls on one side only."""


def gloo_group(store: Any, rank: int, size: int = 2) -> Any:
    """A gloo process group of rank ``rank`` over ``store``, outside torch's default group
    (its collectives still go through the dispatcher, as DDP's do)."""
    from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

    group = dist.ProcessGroup(PrefixStore("pair", store), rank, size)
    backend = ProcessGroupGloo(
        PrefixStore("pair", store), rank, size, datetime.timedelta(seconds=60)
    )
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    return group


def gloo_pair() -> list[Any]:
    """Two process groups of one 2-rank gloo job (ranks 0 and 1) in this process."""
    from torch._C._distributed_c10d import HashStore

    store = HashStore()
    groups: list[Any] = [None, None]

    def make(rank: int) -> None:
        groups[rank] = gloo_group(store, rank)

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return groups


PEER = """
import datetime, os, sys, time
import torch
sys.path.insert(0, sys.argv[3])
from tests.test_collective_wait import gloo_group
store = torch.distributed.TCPStore("127.0.0.1", int(sys.argv[1]), 2, False,
                                   datetime.timedelta(seconds=60))
group = gloo_group(store, 1)
for ms in map(int, sys.argv[2].split(",")):
    store.wait(["go"])  # set by rank 0 as it enters its all-reduce
    store.delete_key("go")
    time.sleep(ms / 1000)
    group.allreduce([torch.ones(1000)]).wait()
os._exit(0)  # as tests/ranks_job.py: gloo's threads sometimes abort the interpreter's teardown
"""
"""Rank 1, in a process of its own: it all-reduces the given milliseconds after rank 0."""


def test_the_ring_counts_a_collective_while_no_other_phase_is_open(implementation: str) -> None:
    """Two overlapping collectives (one left on another thread) count once, across a step
    boundary split between the steps, and not while the thread is in GC."""
    from array import array

    from stepscope.step_times import StepTimes

    times = StepTimes(capacity=8, implementation=implementation, phases=True)
    ring = times.ring
    times.begin(0)
    t0 = time.perf_counter_ns()
    ring.enter(3)
    time.sleep(0.01)
    ring.enter(3)  # a second collective in flight: the union counts
    time.sleep(0.01)
    ring.leave(3)
    first = time.perf_counter_ns() - t0
    times.end()
    times.begin(0)
    t1 = time.perf_counter_ns()
    time.sleep(0.01)
    ring.enter(2)  # a collection while the collective is in flight: GC's time, not its
    time.sleep(0.02)
    ring.leave(2)
    time.sleep(0.01)
    done = threading.Thread(target=ring.leave, args=(3,))  # completed on another thread
    done.start()
    done.join()
    second = time.perf_counter_ns() - t1
    times.end()
    ring.settle()
    _, count, *columns = ring.take(0)
    gc_ns, collective = array("q"), array("q")
    gc_ns.frombytes(columns[5])
    collective.frombytes(columns[6])
    assert count == 2
    assert collective[0] == pytest.approx(first, abs=SLICE_NS)  # still in flight at the end
    assert gc_ns[1] >= 20_000_000
    assert collective[1] == pytest.approx(second - gc_ns[1], abs=SLICE_NS)
    assert collective[1] + gc_ns[1] == pytest.approx(second, abs=SLICE_NS)


@pytest.mark.slow  # rank 1 is a process of its own
def test_collective_time_per_step_matches_the_time_around_each_all_reduce(
    tmp_path: Path,
) -> None:
    """The profiled rank 0 works 5 ms, then all-reduces with rank 1 (another process), which
    comes 10-40 ms after it: its step's collective_ns is the time it spent in the all-reduce,
    busy_ns the rest."""
    import stepscope

    late_ms = [10, 40, 20, 10, 30, 15]
    port = free_port()
    store = dist.TCPStore(
        "127.0.0.1", port, 2, True, datetime.timedelta(seconds=60), wait_for_workers=False
    )
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, str(port), ",".join(map(str, late_ms)), str(ROOT)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    zero = gloo_group(store, 0)
    measured: list[tuple[int, int]] = []
    failures_before = failure_counts().get("collectors", {})
    tensor = torch.ones(1000)
    with stepscope.profile(step_tables=StepTables(tmp_path, run="pair"), torch_ops=False) as p:
        for _ in late_ms:
            began = time.perf_counter_ns()
            torch.mm(torch.ones(64, 64), torch.ones(64, 64))
            time.sleep(0.005)
            t0 = time.perf_counter_ns()
            store.set("go", "1")  # rank 1 comes late_ms after this rank is in its all-reduce
            zero.allreduce([tensor]).wait()
            waited = time.perf_counter_ns() - t0
            measured.append((waited, time.perf_counter_ns() - began))
            p.step()
    assert peer.wait(timeout=60) == 0
    assert tensor[0].item() == 1 + len(late_ms)  # each all-reduce added the peer's ones
    rows = sorted(pq.read_table(tmp_path).to_pylist(), key=lambda r: r["step"])
    assert len(rows) == len(late_ms)
    for row, (waited, whole) in zip(rows, measured, strict=True):
        assert row["schema_version"] == 2
        assert abs(row["collective_ns"] - waited) <= 0.1 * waited + SLICE_NS, (row, waited)
        assert row["busy_ns"] == row["duration_ns"] - row["collective_ns"]
        assert row["busy_ns"] >= 5_000_000 - SLICE_NS
        assert row["duration_ns"] == pytest.approx(whole, rel=0.1, abs=2 * SLICE_NS)
    assert failure_counts().get("collectors", {}) == failures_before
    assert "c10d::allreduce_" in collective_hook.hooked_operators()


def test_a_collective_open_across_a_step_boundary_is_split_between_the_steps(
    tmp_path: Path,
) -> None:
    """An async all-reduce started in one step and completed in the next counts in both, each
    for its own part (as the ring splits a data fetch)."""
    import stepscope

    zero, one = gloo_pair()
    with stepscope.profile(step_tables=StepTables(tmp_path, run="split"), torch_ops=False) as p:
        p.step()
        peer = threading.Timer(0.04, lambda: one.allreduce([torch.ones(10)]).wait())
        peer.start()
        t0 = time.perf_counter_ns()
        work = zero.allreduce([torch.ones(10)])  # async: completes once the peer comes
        time.sleep(0.015)
        first = time.perf_counter_ns() - t0
        p.step()
        t1 = time.perf_counter_ns()
        work.wait()
        second = time.perf_counter_ns() - t1
        p.step()
        peer.join()
    rows = sorted(pq.read_table(tmp_path).to_pylist(), key=lambda r: r["step"])
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert abs(rows[1]["collective_ns"] - first) <= 0.1 * first + SLICE_NS
    assert abs(rows[2]["collective_ns"] - second) <= 0.1 * second + SLICE_NS
    assert rows[0]["collective_ns"] == 0


def test_a_failing_collective_raises_as_it_would_and_closes_its_phase(tmp_path: Path) -> None:
    """The backend's own error reaches the caller unchanged; the step after it holds no open
    collective phase."""
    import stepscope

    zero, _ = gloo_pair()
    with stepscope.profile(step_tables=StepTables(tmp_path, run="bad"), torch_ops=False) as p:
        with pytest.raises(Exception) as raised:
            # gloo rejects a broadcast from a rank outside the group, inside the operator
            zero.broadcast(torch.ones(3), 7)
        p.step()
        time.sleep(0.01)
        p.step()
    from torch._C._distributed_c10d import BroadcastOptions

    options = BroadcastOptions()
    options.rootRank = 7
    with pytest.raises(Exception) as direct:  # the backend alone, below the dispatcher
        zero._get_backend(torch.device("cpu")).broadcast([torch.ones(3)], options)
    assert type(raised.value) is type(direct.value)
    assert str(raised.value) == str(direct.value)
    rows = sorted(pq.read_table(tmp_path).to_pylist(), key=lambda r: r["step"])
    assert rows[1]["collective_ns"] == 0


def test_version_1_tables_are_read_alone_and_beside_version_2(tmp_path: Path) -> None:
    """Tables written before collective_ns and busy_ns: the fleet reads them (the new columns
    null, no waits named), alone or beside version-2 files of another run."""
    from stepscope.steptables.fleet import fleet_report
    from tests.test_fleet_change_point import SHIFT, SLOW_RANK, shifted, write_tables

    old = write_tables(tmp_path / "old", shifted())
    for part in old.rglob("*.parquet"):
        table = pq.read_table(part).drop_columns(["collective_ns", "busy_ns"])
        version = table.schema.get_field_index("schema_version")
        ones = pa.array([1] * table.num_rows, pa.int16())
        table = table.set_column(version, "schema_version", ones)
        pid = table.schema.get_field_index("pid")  # another process than the new run's
        pids = pa.array([p + 1000 for p in table.column(pid).to_pylist()], pa.int32())
        pq.write_table(table.set_column(pid, "pid", pids), part)
    (slow,) = fleet_report(old).slow_ranks
    assert (slow.rank, slow.since_step, slow.phase) == (SLOW_RANK, SHIFT, "data_wait")
    assert slow.waited_ns is None and slow.waiting_ranks is None
    new = write_tables(tmp_path / "new", shifted())
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (old / "run=job").rename(mixed / "run=old")
    (new / "run=job").rename(mixed / "run=new")
    found = {s.run: s for s in fleet_report(mixed).slow_ranks}
    assert found["old"].waited_ns is None and found["new"].waiting_ranks == 3
    assert {s.rank for s in found.values()} == {SLOW_RANK}


class DeviceWork:
    """A stand-in for an NCCL ``Work`` (no GPU here): complete once ``done`` is set, with the
    device time its events would give."""

    def __init__(self, ms: float) -> None:
        self.ms, self.done = ms, False

    def is_completed(self) -> bool:
        return self.done

    def _get_duration(self) -> float:
        return self.ms


def test_a_device_collective_s_time_goes_to_the_step_that_launched_it(tmp_path: Path) -> None:
    """The recorder's side of the device path: rows from the launching step on wait for the
    work, which is credited there once complete; at close one still running is counted."""
    import stepscope

    tables = StepTables(tmp_path, run="device", rows_per_file=1)
    first, second = DeviceWork(7.5), DeviceWork(2.0)
    with stepscope.profile(step_tables=tables, torch_ops=False) as p:
        p.step()
        tables.device_collective(first)  # launched in step 1, completes during step 3
        p.step()
        tables.device_collective(second)  # step 2: still running at the close
        p.step()
        # the writer thread polls every 20 ms: without the wait it would take rows 0-2 and
        # write 0 and 1 (a group of one row goes once a row after it is seen)
        time.sleep(0.5)
        written = sorted(
            s for f in tmp_path.rglob("*.parquet") for s in pq.read_table(f)["step"].to_pylist()
        )
        first.done = True
        p.step()
    rows = sorted(pq.read_table(tmp_path).to_pylist(), key=lambda r: r["step"])
    assert 1 not in written and 2 not in written, written
    assert [r["collective_ns"] for r in rows] == [0, 7_500_000, 0, 0]
    assert tables.untimed_collectives == 1


@pytest.mark.slow
def test_compiled_collectives_add_no_graph_break(tmp_path: Path) -> None:
    """dynamo traces ``dist.all_reduce`` into a functional collective whether or not the hook
    listens: no graph break, and the compiled function's result is the same."""
    import stepscope

    def run() -> tuple[int, float]:
        torch._dynamo.reset()

        def step(x: Any) -> Any:
            y = x * 2
            dist.all_reduce(y)
            return y + 1

        explained = torch._dynamo.explain(step)(torch.ones(8))
        return explained.graph_break_count, float(torch.compile(step)(torch.ones(8)).sum())

    from torch._C._distributed_c10d import HashStore

    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        plain = run()
        with stepscope.profile(step_tables=StepTables(tmp_path, run="c"), torch_ops=False):
            listened = run()
    finally:
        dist.destroy_process_group()
    assert plain == listened == (0, 24.0)


# -- the fault-injection jobs ---------------------------------------------------------------

STEPS = 40
FROM_STEP = 20
SLOW_MS = 20.0
EXPECTED_PHASE = {"data": "data_wait", "compute": "compute", "gc": "gc", "sleep": "host"}


def straggler_job(
    out: Path, ranks: int, fault: str, slow_rank: int, *, traces: bool = False, run: bool = False
) -> tuple[Path, list[int]]:
    """(step tables directory, the slow rank's injected ns per step) of one torchrun job;
    ``traces``: with a trace window too; ``run``: under ``stepscope run --step-tables``."""
    if not TORCHRUN.exists():
        pytest.skip(f"{TORCHRUN} is not installed with torch here")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    if traces:
        env["STRAGGLER_JOB_TRACES"] = str(out / "traces")
    under: list[str] = []
    if run:
        env["STRAGGLER_JOB_RUN"] = "1"
        under = ["-m", "stepscope", "run", "-o", str(out / "run"), "--step-tables"]
        under.append(str(out / "tables"))
    cmd = [
        str(TORCHRUN), f"--nproc-per-node={ranks}", "--master-addr=127.0.0.1",
        f"--master-port={free_port()}", *under, str(JOB), str(out / "tables"), fault,
        str(slow_rank), str(FROM_STEP), str(SLOW_MS), str(STEPS),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    injected = json.loads((out / f"injected-{slow_rank}.json").read_text())
    return out / "tables", injected


def fleet_json(tables: Path, out: Path) -> dict[str, Any]:
    done = stepscope_cli("fleet", str(tables), "--json", str(out), "--html", f"{out}.html")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(out.read_text())
    return report


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ranks", "fault", "slow_rank"), [(2, "sleep", 1), (4, "data", 2), (2, "gc", 0)]
)
def test_fleet_names_the_rank_the_others_waited_for(
    tmp_path: Path, ranks: int, fault: str, slow_rank: int
) -> None:
    tables, injected = straggler_job(tmp_path, ranks, fault, slow_rank)
    report = fleet_json(tables, tmp_path / "fleet.json")
    assert report["version"] == 2 and report["ranks"] == ranks
    slow = report["slow_ranks"][0]
    assert (slow["rank"], slow["phase"]) == (slow_rank, EXPECTED_PHASE[fault]), slow
    assert abs(slow["since_step"] - FROM_STEP) <= 2, slow
    # the others waited for it about as long as it spent in the injected work (measured by
    # its own clock); before the fault, not
    per_step = sum(injected[FROM_STEP:]) / (STEPS - FROM_STEP)
    assert slow["waited_ns"] == pytest.approx(per_step, rel=0.3), (slow, per_step)
    assert slow["mean_lag_ns"] == pytest.approx(per_step, rel=0.3), (slow, per_step)
    assert abs(slow["waited_before_ns"]) < 0.3 * per_step, slow
    assert slow["waiting_ranks"] == ranks - 1 and slow["least_wait"], slow
    page = (tmp_path / "fleet.json.html").read_text()
    assert f"Rank {slow_rank} is the rank the others waited for" in page


@pytest.mark.slow
def test_an_unslowed_job_names_nobody(tmp_path: Path) -> None:
    tables, _ = straggler_job(tmp_path, 2, "none", 0)
    report = fleet_json(tables, tmp_path / "fleet.json")
    assert report["slow_ranks"] == [], report["slow_ranks"]


@pytest.mark.slow
def test_under_stepscope_run_and_beside_the_trace_report(tmp_path: Path) -> None:
    """The issue's job: 2 gloo DDP ranks, rank 1 sleeping before each forward, under
    ``stepscope run --step-tables``: the fleet names rank 1 (steps end at the optimizer there,
    so its sleep may fall a step earlier); and with a trace window, ``stepscope report`` on the
    window names the same rank, with a busy excess per step like the fleet's lag there."""
    tables, _ = straggler_job(tmp_path / "run", 2, "sleep", 1, run=True)
    slow = fleet_json(tables, tmp_path / "run.json")["slow_ranks"][0]
    assert (slow["rank"], slow["phase"]) == (1, "host") and abs(slow["since_step"] - FROM_STEP) <= 2

    tables, _ = straggler_job(tmp_path / "traced", 2, "sleep", 1, traces=True)
    fleet = fleet_json(tables, tmp_path / "fleet.json")
    done = stepscope_cli(
        "report", str(tmp_path / "traced" / "traces"), "--json", str(tmp_path / "r.json")
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    (straggler,) = [r for r in report["combined"]["recommendations"] if r["rule"] == "straggler"]
    evidence = straggler["evidence"]
    assert evidence["rank"] == fleet["slow_ranks"][0]["rank"] == 1
    # the trace's uncategorised time is the tables' host phase
    assert evidence["phase"] == "idle_other" and fleet["slow_ranks"][0]["phase"] == "host"
    window = [r["step"] for r in report["ranks"]["steps"]]
    lags = [s["lag_ns"] for s in fleet["stragglers"] if s["step"] in window and s["rank"] == 1]
    assert len(lags) == len(window) == 3
    per_step = sum(lags) / len(lags) / 1e6
    assert per_step == pytest.approx(evidence["busy_excess_ms_per_step"], rel=0.3, abs=2.0)
