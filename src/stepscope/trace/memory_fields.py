"""The names under which memory is written into a trace, and how torch's ``[memory]`` instants
are read back: one place for the recorder that writes them and the analysis that reads them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from stepscope.trace.model import Trace
from stepscope.trace.raw_args import arg_rows

__all__ = [
    "BY_MODULE_KEY",
    "MEMORY_INSTANT",
    "MEMORY_KEY",
    "PYTHON_HEAP_TRACK",
    "RSS_TRACK",
    "TIMELINE_POINTS",
    "HeapByModule",
    "StepMemoryRow",
    "TensorEvent",
    "device_name",
    "heap_by_module",
    "step_rows",
    "tensor_events",
    "thin_points",
]

MEMORY_KEY = "stepscope_memory"
"""Trace metadata key of the memory collector's per-step results."""
BY_MODULE_KEY = "by_module"
"""Key, under ``MEMORY_KEY``, of the Python heap held by module at each snapshot."""
MEMORY_INSTANT = "[memory]"
PYTHON_HEAP_TRACK = "Python heap"
"""The counter track of the traced Python heap (bytes held, since the window started)."""
RSS_TRACK = "RSS"
"""The counter track of the process's resident set size."""
TIMELINE_POINTS = 1000
"""Points per series kept in a report's timeline."""
_TENSOR_KEYS = ("Bytes", "Total Allocated", "Device Type", "Device Id", "Addr")
_DEVICE_TYPES = {0: "cpu", 1: "cuda", 12: "xpu", 13: "mps", 23: "mtia", 20: "privateuseone"}


class TensorEvent(NamedTuple):
    """One ``[memory]`` instant: an allocation (bytes > 0) or a free (bytes < 0)."""

    ts_ns: int
    device: str
    bytes: int
    total_allocated: int
    pid: int
    tid: int
    """The track as the trace's pid/tid columns encode it."""
    addr: int


def device_name(device_type: Any, device_id: Any) -> str:
    """torch's device of a ``[memory]`` event: ``cpu``, ``cuda:0``..."""
    kind = _DEVICE_TYPES.get(int(device_type), f"device{int(device_type)}")
    return kind if kind == "cpu" else f"{kind}:{max(int(device_id), 0)}"


def tensor_events(
    instants: Iterable[tuple[int, int, int, Mapping[str, Any] | None]],
) -> list[TensorEvent]:
    """``[memory]`` instants ``(ts, pid, tid, args)`` as events, in time order."""
    found: list[TensorEvent] = []
    listed = instants if isinstance(instants, list) else list(instants)
    # plain integers read from the args' text in one pass, no JSON parse
    rows = arg_rows([args for _, _, _, args in listed], _TENSOR_KEYS)
    devices: dict[tuple[Any, Any], str] = {}
    for (ts, pid, tid, _), (size, total, device_type, device_id, addr) in zip(
        listed, rows, strict=True
    ):
        if size is None or total is None:
            continue
        try:
            device = devices.get((device_type, device_id))
            if device is None:
                device = devices[(device_type, device_id)] = device_name(
                    0 if device_type is None else device_type,
                    -1 if device_id is None else device_id,
                )
            found.append(TensorEvent(ts, device, int(size), int(total), pid, tid, int(addr or 0)))
        except (TypeError, ValueError):
            continue  # a malformed event is left out, not guessed at
    found.sort(key=lambda e: e.ts_ns)
    return found


def thin_points(
    points: list[tuple[int, int]], most: int = TIMELINE_POINTS
) -> list[tuple[int, int]]:
    """At most ``most`` points, keeping the highest of each stretch (peaks stay visible)."""
    if len(points) <= most:
        return points
    width = len(points) / most
    return [
        max(
            points[int(i * width) : max(int((i + 1) * width), int(i * width) + 1)],
            key=lambda p: p[1],
        )
        for i in range(most)
    ]


def _int(value: Any) -> int | None:
    """``value`` when it is an integer (a row from an unknown writer may hold anything)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class StepMemoryRow:
    """One step of the memory metadata (``stepscope_memory.steps``): its times, the Python heap
    and the process at its end, torch's CUDA allocator, the sites that changed."""

    step: int
    start_ns: int
    end_ns: int
    python_current: int | None = None
    """Python heap held at the step's end; None when it was not read (the program had stopped
    tracemalloc): such a row has its times only."""
    python_peak: int | None = None
    """The most the Python heap held during the step."""
    rss: int | None = None
    """Resident set size at the step's end (None: not read)."""
    python_allocated: int | None = None
    """Bytes allocated during the step (the allocation hook's count; None under tracemalloc)."""
    python_freed: int | None = None
    site_changes: tuple[tuple[int, int, int], ...] | None = None
    """``(site, bytes, blocks)`` of the sites that changed most since the last snapshot (site:
    an index into ``stepscope_memory.sites``); None when no snapshot was taken at this end."""
    site_changes_since_ns: int | None = None
    """The time of that last snapshot."""
    cuda_allocator: Mapping[str, int] = field(default_factory=dict)
    """torch's CUDA caching allocator counters at the step's end, when the program used CUDA."""

    def to_json(self) -> dict[str, Any]:
        """The row as the trace holds it (keys in this order; what was not measured left out)."""
        row: dict[str, Any] = {"step": self.step, "start_ns": self.start_ns, "end_ns": self.end_ns}
        if self.python_current is not None:
            row["python_current"] = self.python_current
            row["python_peak"] = self.python_peak
            if self.python_allocated is not None:
                row["python_allocated"] = self.python_allocated
                row["python_freed"] = self.python_freed
            row["rss"] = self.rss
        if self.site_changes is not None:
            row["site_changes"] = [list(change) for change in self.site_changes]
            row["site_changes_since_ns"] = self.site_changes_since_ns
        if self.cuda_allocator:
            row["cuda_allocator"] = dict(self.cuda_allocator)
        return row

    @classmethod
    def from_json(cls, row: Any) -> StepMemoryRow | None:
        """A row read back from a trace; None when it names no step (values that are not
        integers read as not measured)."""
        if not isinstance(row, Mapping) or _int(row.get("step")) is None:
            return None
        changes = row.get("site_changes")
        cuda = row.get("cuda_allocator")
        return cls(
            row["step"],
            _int(row.get("start_ns")) or 0,
            _int(row.get("end_ns")) or 0,
            _int(row.get("python_current")),
            _int(row.get("python_peak")),
            _int(row.get("rss")),
            _int(row.get("python_allocated")),
            _int(row.get("python_freed")),
            tuple(
                (c[0], c[1], c[2])
                for c in changes
                if isinstance(c, list) and len(c) == 3 and all(_int(v) is not None for v in c)
            )
            if isinstance(changes, list)
            else None,
            _int(row.get("site_changes_since_ns")),
            {str(k): v for k, v in cuda.items() if _int(v) is not None}
            if isinstance(cuda, Mapping)
            else {},
        )


def step_rows(memory: Mapping[str, Any]) -> list[StepMemoryRow]:
    """The per-step rows of a trace's memory metadata, in the order written."""
    rows = memory.get("steps")
    if not isinstance(rows, list):
        return []
    return [row for r in rows if (row := StepMemoryRow.from_json(r)) is not None]


@dataclass(frozen=True, slots=True)
class HeapByModule:
    """The Python heap held by top-level module at each snapshot of a window (step ends, the
    peak), in time order: what ``export_memory_timeline(device="python")`` draws."""

    modules: tuple[str, ...]
    """In the order they first held memory."""
    points: tuple[tuple[int, tuple[int, ...]], ...]
    """``(unix ns, bytes per module)``, the bytes in ``modules`` order."""


def heap_by_module(trace: Trace) -> HeapByModule | None:
    """The Python heap by module that the memory collector wrote into ``trace``; None when it
    wrote none.  Its times are the recording process's clock, as all of ``MEMORY_KEY``'s:
    ``stepscope_clock.wall_base_ns`` makes them Unix times (a written file re-bases its events
    only)."""
    memory = trace.metadata.get(MEMORY_KEY)
    found = memory.get(BY_MODULE_KEY) if isinstance(memory, Mapping) else None
    if not isinstance(found, Mapping):
        return None
    modules = found.get("modules")
    rows = found.get("points")
    if not isinstance(modules, list) or not isinstance(rows, list):
        return None
    clock = trace.metadata.get("stepscope_clock")
    base = _int(clock.get("wall_base_ns")) if isinstance(clock, Mapping) else None
    base = trace.base_time_ns if base is None else base
    points = []
    for row in rows:
        values = [_int(v) for v in row] if isinstance(row, list) else []
        if len(values) != len(modules) + 1 or any(v is None for v in values):
            continue  # a malformed point is left out, not guessed at
        t_ns, *held = (v or 0 for v in values)
        points.append((base + t_ns, tuple(held)))
    return HeapByModule(tuple(str(m) for m in modules), tuple(points))
