"""``stepscope run`` on GPU trainers, as a user runs it: the test suite's transformers
``Trainer`` and Lightning ``fit`` (``tests/test_run_trainers.py``) on ``cuda``, with the
defaults and with ``--memory``; then ``stepscope report``.

    python bench/cuda_trainers.py OUT_DIR

Checks that each program finishes (exit 0, its own ``finished`` line) and that the report has
the recorded steps, a forward/backward/optimizer breakdown, kernels on the device and, with
``--memory``, the CUDA allocator's columns; prints each report for reading.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_run_trainers import PROGRAMS as CPU_PROGRAMS  # noqa: E402

PROGRAMS = {
    # the test suite's programs, on the GPU
    "hf_trainer": CPU_PROGRAMS["hf_trainer"].replace(" use_cpu=True,", ""),
    "lightning_fit": CPU_PROGRAMS["lightning_fit"].replace(
        'accelerator="cpu"', 'accelerator="gpu", devices=1'
    ),
}


def stepscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m stepscope ARGS`` in ``cwd``."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "stepscope", *args],
        capture_output=True, text=True, timeout=300, cwd=cwd, env=env, check=False,
    )  # fmt: skip


def main(out: Path) -> int:
    """Run every program both ways; the exit status."""
    failures = []
    for name, code in PROGRAMS.items():
        for flags in ((), ("--memory",)):
            label = f"{name} {' '.join(flags) or 'defaults'}"
            work = out / f"{name}{'_memory' if flags else ''}"
            work.mkdir(parents=True, exist_ok=True)
            (work / "prog.py").write_text(code)
            done = stepscope("run", "-o", "traces", "--top", "5", *flags, "prog.py", "tr", cwd=work)
            print(f"== {label}: exit {done.returncode}\n{done.stdout[-1500:]}{done.stderr[-2500:]}")
            if done.returncode != 0 or "finished" not in done.stdout:
                failures.append(f"{label}: exit {done.returncode}")
                continue
            report = stepscope("report", "traces", "--json", "report.json", cwd=work)
            print(report.stdout[-6000:], report.stderr[-800:])
            data = json.loads((work / "report.json").read_text())["combined"]
            shares = {c["name"]: c["pct"] for c in data["host_total"]["categories"]}
            kernels = data.get("kernels") or []
            print(f"{label}: steps {data['step_stats']['count']}, host {shares}, kernels "
                  f"{len(kernels)}")  # fmt: skip
            if data["step_stats"]["count"] < 2 or not {"forward", "backward"} <= set(shares):
                failures.append(f"{label}: steps or breakdown missing: {shares}")
            if not kernels:
                failures.append(f"{label}: no kernels in the report")
            memory = data.get("memory") or {}
            if flags and not any(s.get("cuda_allocator") for s in memory.get("steps", [])):
                failures.append(f"{label}: no CUDA allocator rows")
    for failure in failures:
        print("FAIL:", failure)
    print("cuda_trainers:", "FAILED" if failures else "passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "out/cuda_trainers").resolve()))
