"""``stepscope report --jobs N`` and ``--engine ray``: the same JSON as the serial report.

On a rank directory of real GPU traces (NCCL on CUDA, ROCm) plus a third real training rank,
so the cross-rank section (collectives matched across files) is part of what must match.  Ray
runs as a real local cluster started once for the module (reached by address or RAY_ADDRESS),
and as the local cluster ``--engine ray`` starts itself when no cluster is running.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.analysis_helpers import SHARED
from tests.test_ranks import ROOT, gpu_rank_dir, stepscope_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rank_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """(directory of three rank traces, the serial report's JSON)."""
    folder = gpu_rank_dir(tmp_path_factory.mktemp("ranks"))
    shutil.copy(SHARED / "training_rank0_gpu.json.gz", folder / "train_rank2.json.gz")
    out = folder.parent / "serial.json"
    done = stepscope_cli("report", str(folder), "--json", str(out))
    assert done.returncode == 0, done.stderr
    return folder, out.read_bytes()


def test_jobs_give_the_serial_json(rank_dir: Any, tmp_path: Path) -> None:
    folder, serial = rank_dir
    assert b'"ranks": {' in serial or b'"ranks":{' in serial  # the cross-rank part is there
    out = tmp_path / "jobs.json"
    done = stepscope_cli("report", str(folder), "--jobs", "2", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == serial


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """The address of a local Ray cluster this module starts (and shuts down)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()


CONNECTED = "stepscope report: --engine ray: connected to the Ray cluster at"


def ray_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines of stderr that say where Ray ran."""
    return [line for line in done.stderr.splitlines() if "--engine ray" in line]


def test_ray_tasks_give_the_serial_json(rank_dir: Any, ray_address: str, tmp_path: Path) -> None:
    folder, serial = rank_dir
    out = tmp_path / "ray.json"
    done = stepscope_cli(
        "report", str(folder), "--engine", f"ray:{ray_address}", "--json", str(out)
    )
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == serial
    assert ray_lines(done) == [f"{CONNECTED} {ray_address}"]


def report_on_ray(folder: Path, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``report --engine ray`` with no address, RAY_ADDRESS unset unless given, and a Ray temp
    folder of its own (short: ray's socket paths must fit), so no cluster that ``ray start``
    left on this machine is found."""
    with tempfile.TemporaryDirectory(prefix="ss-ray-", dir="/tmp") as ray_tmp:
        environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        environ.update(PYTHONPATH=str(ROOT / "src"), RAY_TMPDIR=ray_tmp, **env)
        command = [sys.executable, "-m", "stepscope", "report", str(folder), "--engine", "ray"]
        return subprocess.run(
            [*command, "--json", str(out)], capture_output=True, text=True, timeout=300, env=environ
        )


def test_ray_with_no_cluster_running_starts_a_local_one(rank_dir: Any, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    folder, serial = rank_dir
    out = tmp_path / "ray.json"
    done = report_on_ray(folder, out)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == serial  # --jobs 1's JSON
    said = ray_lines(done)
    assert len(said) == 1 and "no Ray cluster running" in said[0], done.stderr
    assert "started a local one" in said[0]


def test_ray_address_in_the_environment_is_connected_to(
    rank_dir: Any, ray_address: str, tmp_path: Path
) -> None:
    folder, serial = rank_dir
    out = tmp_path / "ray.json"
    done = report_on_ray(folder, out, RAY_ADDRESS=ray_address)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == serial
    assert ray_lines(done) == [f"{CONNECTED} {ray_address}"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--engine", "spark"], "expected 'processes', 'ray'"),
        (["--engine", "processes:x"], "expected 'processes', 'ray'"),
        (["--jobs", "0"], "--jobs must be 1 or more"),
        (["--jobs", "2", "--html", "x.html"], "leave out --jobs"),
    ],
)
def test_bad_options_are_one_line_errors(rank_dir: Any, args: list[str], says: str) -> None:
    folder, _ = rank_dir
    done = stepscope_cli("report", str(folder), *args)
    assert done.returncode == 1
    assert says in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_an_unreadable_file_is_skipped_alike(rank_dir: Any, tmp_path: Path) -> None:
    folder, _ = rank_dir
    mixed = tmp_path / "mixed"
    shutil.copytree(folder, mixed)
    (mixed / "broken_rank9.json").write_text("{not json")
    outputs = []
    for extra in ([], ["--jobs", "2"]):
        out = tmp_path / f"r{len(extra)}.json"
        done = stepscope_cli("report", str(mixed), "--json", str(out), *extra)
        assert done.returncode == 1  # files were skipped
        skipped = [line for line in done.stderr.splitlines() if "skipped" in line]
        assert len(skipped) == 1 and "broken_rank9.json" in skipped[0]
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
