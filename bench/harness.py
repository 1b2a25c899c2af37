"""Shared benchmark harness: repeated timings, medians and spreads, ratios against peers.

Each ``bench/bench_*.py`` defines ``run(report: Report) -> None`` and records measurements with
``report.measure(...)`` or ``report.add(...)``, and targets with ``report.target(...)``.  The
runner (``bench/run.py``) prints every result as it arrives and writes ``bench/RESULTS.md``.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parent.parent / "src")


def run_json_child(
    argv: Sequence[str], *, timeout: float | None = None, cwd: str | None = None
) -> tuple[float, Any]:
    """Run a benchmark child (this checkout's ``src`` first on its path): (wall seconds, the
    JSON object on its last line of output); its stderr's tail in the error when it fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    start = time.perf_counter()
    done = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:3])} failed: {done.stderr[-2000:]}")
    return wall, json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class Result:
    """One measured quantity for one subject (stepscope or a peer)."""

    bench: str
    case: str
    subject: str
    unit: str
    samples: list[float]
    note: str = ""

    @property
    def median(self) -> float:
        """Median of the samples."""
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """Relative spread: (max - min) / median."""
        med = self.median
        return (max(self.samples) - min(self.samples)) / med if med else 0.0


@dataclass
class Target:
    """A stated target and whether this run met it."""

    bench: str
    description: str
    value: float
    limit: float
    met: bool


@dataclass
class Report:
    """Collects results and targets of one benchmark module."""

    bench: str
    quick: bool = False
    results: list[Result] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def add(
        self, case: str, subject: str, unit: str, samples: list[float], note: str = ""
    ) -> Result:
        """Record samples measured elsewhere."""
        result = Result(self.bench, case, subject, unit, list(samples), note)
        self.results.append(result)
        print(
            f"  {case:<40} {subject:<28} median {result.median:>12.4g} {unit:<10} "
            f"spread {result.spread:6.1%}",
            flush=True,
        )
        return result

    def measure(
        self,
        case: str,
        subject: str,
        fn: Callable[[], object],
        *,
        repeat: int = 7,
        per_call: int = 1,
        unit: str = "ns/call",
        setup: Callable[[], object] | None = None,
    ) -> Result:
        """Time ``fn`` ``repeat`` times; each sample is elapsed ns divided by ``per_call``."""
        samples = []
        for _ in range(repeat):
            if setup is not None:
                setup()
            gc.collect()
            start = time.perf_counter_ns()
            fn()
            elapsed = time.perf_counter_ns() - start
            samples.append(elapsed / per_call)
        if unit == "s":
            samples = [s / 1e9 for s in samples]
        elif unit == "ms":
            samples = [s / 1e6 for s in samples]
        return self.add(case, subject, unit, samples)

    def ratio(self, case: str, subject: Result, peer: Result) -> float:
        """Print and record subject/peer median ratio."""
        value = subject.median / peer.median if peer.median else float("inf")
        line = f"  ratio {case}: {subject.subject} / {peer.subject} = {value:.3f}"
        self.lines.append(line.strip())
        print(line, flush=True)
        return value

    def target(self, description: str, value: float, limit: float) -> bool:
        """Record whether ``value <= limit``."""
        met = value <= limit
        self.targets.append(Target(self.bench, description, value, limit, met))
        print(
            f"  target {description}: {value:.4g} (limit {limit:.4g}) -> "
            f"{'met' if met else 'NOT met'}",
            flush=True,
        )
        return met

    def note(self, text: str) -> None:
        """A free-form line for RESULTS.md."""
        self.lines.append(text)
        print(f"  {text}", flush=True)
