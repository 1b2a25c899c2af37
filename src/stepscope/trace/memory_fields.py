"""The names under which memory is written into a trace, and how torch's ``[memory]`` instants
are read back: one place for the recorder that writes them and the analysis that reads them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from stepscope.trace.raw_args import arg_rows

__all__ = [
    "MEMORY_INSTANT",
    "MEMORY_KEY",
    "PYTHON_HEAP_TRACK",
    "RSS_TRACK",
    "TIMELINE_POINTS",
    "TensorEvent",
    "device_name",
    "tensor_events",
    "thin_points",
]

MEMORY_KEY = "stepscope_memory"
"""Trace metadata key of the memory collector's per-step results."""
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
