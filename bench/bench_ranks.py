"""``stepscope merge`` and ``stepscope report`` on real 2-, 4- and 8-rank torchrun jobs (gloo, CPU).

Each job is ``tests/ranks_job.py`` (a tiny DDP loop, one window of 3 steps per rank, rank 1
slow); a last case gives 8 ranks the size of a real GPU rank (copies of the shared
``training_rank0_gpu`` trace, 45k spans each) for the per-event cost.  Every command runs in
its own fresh process: wall time of the whole process (imports included) and its peak RSS.
The peer is HTA loading the same directory as a multi-rank trace
(``TraceAnalysis(trace_dir=...)``: it reads every rank but neither aligns clocks nor merges;
its temporal breakdown needs GPU kernels, which these CPU ranks do not have).  No target: the
numbers feed ``docs/scaling.md``'s extrapolation to 1,024 ranks.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import Report, run_json_child

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
JOB = ROOT / "tests" / "ranks_job.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
RANKS = (2, 4, 8)
SHARED = ROOT.parent / "shared" / "traces"
GPU_RANK = SHARED / "training_rank0_gpu.json.gz"

CHILD = r"""
import json, resource, sys, time, logging, warnings
t0 = time.perf_counter()
kind, path, scratch = sys.argv[1:4]
if kind == "merge":
    from stepscope.cli import main
    assert main(["merge", path, "-o", scratch + "/merged.json.gz"]) == 0
elif kind == "report":
    import io, contextlib
    from stepscope.cli import main
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["report", path, "--json", scratch + "/r.json"]) == 0
else:
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from hta.trace_analysis import TraceAnalysis
    TraceAnalysis(trace_dir=path)
print(json.dumps([time.perf_counter() - t0,
                  resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_job(out: Path, ranks: int) -> float:
    """Run the DDP job on ``ranks`` processes; its wall time (s)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    start = time.perf_counter()
    done = subprocess.run(
        [
            str(TORCHRUN),
            f"--nproc-per-node={ranks}",
            "--master-addr=127.0.0.1",
            f"--master-port={_free_port()}",
            str(JOB),
            str(out),
            "1",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{ranks}-rank job failed: {done.stderr[-2000:]}")
    return time.perf_counter() - start


def run_child(kind: str, path: Path, scratch: Path) -> tuple[float, float, float]:
    """(in-process seconds, whole-process seconds, peak MiB) of one fresh process."""
    wall, found = run_json_child(
        [sys.executable, "-c", CHILD, kind, str(path), str(scratch)], timeout=600
    )
    inner, rss_self, rss_children = found
    return inner, wall, max(rss_self, rss_children) / 1024


def gpu_ranks(out: Path, ranks: int) -> None:
    """``ranks`` copies of a real 45k-span GPU rank (rank rewritten): realistic per-rank size."""
    import gzip

    doc = json.loads(gzip.decompress(GPU_RANK.read_bytes()))
    out.mkdir()
    for rank in range(ranks):
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": rank}
        (out / f"gpu_rank{rank}.pt.trace.json").write_text(json.dumps(doc))


def run(report: Report) -> None:
    """Jobs of 2, 4 and 8 ranks; merge, report and HTA's load of each."""
    repeat = 1 if report.quick else 3
    names = {"merge": "stepscope merge", "report": "stepscope report", "hta": "HTA TraceAnalysis"}
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in (*RANKS, -8):
            out = Path(tmp) / f"ranks{ranks}"
            if ranks < 0:
                ranks = -ranks
                gpu_ranks(out, ranks)
                job_s = 0.0
            else:
                job_s = run_job(out, ranks)
            files = sorted(out.glob("*.json*"))
            size = sum(f.stat().st_size for f in files)
            events = sum(len(json.loads(f.read_bytes())["traceEvents"]) for f in files)
            report.note(
                f"{ranks} ranks: job {job_s:.1f} s, {len(files)} files, {size / 1e6:.2f} MB, "
                f"{events} events"
            )
            size_note = "GPU-size " if job_s == 0.0 else ""
            case = f"{ranks} {size_note}ranks ({events} events)"
            walls = {}
            for kind in ("merge", "report", "hta"):
                samples = [run_child(kind, out, Path(tmp)) for _ in range(repeat)]
                walls[kind] = report.add(case, names[kind], "s", [s[1] for s in samples])
                report.add(case + " (in process)", names[kind], "s", [s[0] for s in samples])
                report.add(case, names[kind], "MiB peak", [s[2] for s in samples])
            report.ratio(case + " wall", walls["merge"], walls["hta"])
            report.ratio(case + " wall", walls["report"], walls["hta"])
    _ = resource  # the children measure themselves
