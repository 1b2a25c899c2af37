"""Whether two runs can be compared: their steps, ranks, activities, versions and machine.

``run_facts`` reads what each run's traces say about how they were recorded; ``mismatches``
gives one line per fact that differs between A and B (empty when they match).  A diff of runs
that differ in any of these may show changes the program did not make.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stepscope.analysis.result import TraceSummary
from stepscope.trace.model import Trace
from stepscope.trace.nesting import DEVICE_CATEGORIES

__all__ = ["RunFacts", "mismatches", "run_facts"]

_FLAGS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


@dataclass(frozen=True)
class RunFacts:
    """How one run was recorded, as sets that compare between runs."""

    steps: tuple[int, ...]
    """The analysed step numbers (empty: none, or a trace without steps)."""
    ranks: frozenset[str]
    activities: frozenset[str]
    versions: frozenset[str]
    machine: frozenset[str]


def _activities(trace: Trace) -> set[str]:
    meta = trace.metadata
    named = meta.get("stepscope_activities")
    found = {str(a) for a in named} if isinstance(named, list) else set()
    if not found:  # torch.profiler's own traces: from what they hold
        cats = {trace.strings[c] for c in set(trace.spans["cat"].tolist())}
        if "cpu_op" in cats:
            found.add("CPU")
        if cats & DEVICE_CATEGORIES:
            found.add("device")
        if "python_function" in cats:
            found.add("PYTHON")
    found.update(flag for flag in _FLAGS if meta.get(flag))
    return found


def run_facts(traces: Sequence[tuple[str, Trace]], summary: TraceSummary) -> RunFacts:
    """The facts of one run (all its traces) and its analysis."""
    ranks: set[str] = set()
    activities: set[str] = set()
    versions: set[str] = set()
    machine: set[str] = set()
    for _, trace in traces:
        info = trace.distributed_info or {}
        if "rank" in info:
            ranks.add(f"{info['rank']}/{info.get('world_size', '?')}")
        activities |= _activities(trace)
        meta = trace.metadata
        version = meta.get("stepscope_version")
        versions.add(f"stepscope {version}" if version else "torch.profiler")
        if meta.get("host_name"):
            machine.add(f"host {meta['host_name']}")
        for device in meta.get("deviceProperties") or []:
            if isinstance(device, dict) and device.get("name"):
                machine.add(str(device["name"]))
    numbers = tuple(s.step for s in summary.steps if s.step is not None)
    return RunFacts(
        numbers,
        frozenset(ranks),
        frozenset(activities),
        frozenset(versions),
        frozenset(machine),
    )


def _steps_text(numbers: tuple[int, ...]) -> str:
    if not numbers:
        return "no steps"
    return f"{len(numbers)} steps ({min(numbers)}-{max(numbers)})"


def _set_text(values: frozenset[str]) -> str:
    return ", ".join(sorted(values)) or "none"


def mismatches(a: RunFacts, b: RunFacts) -> list[str]:
    """One line per way A and B were recorded differently."""
    lines = []
    if len(a.steps) != len(b.steps) or (a.steps and min(a.steps) != min(b.steps)):
        lines.append(f"steps differ: A {_steps_text(a.steps)}, B {_steps_text(b.steps)}")
    for what, mine, theirs in (
        ("ranks", a.ranks, b.ranks),
        ("activities", a.activities, b.activities),
        ("versions", a.versions, b.versions),
        ("machine", a.machine, b.machine),
    ):
        if mine != theirs:
            lines.append(f"{what} differ: A {_set_text(mine)}, B {_set_text(theirs)}")
    return lines
