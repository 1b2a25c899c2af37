"""``profile.export_memory_timeline``: torch's memory timeline files, for torch and plain Python.

With torch's data the timeline is torch's own: ``torch.profiler._memory_profiler.MemoryProfile``
categorizes the window's tensors (it needs ``record_shapes=True`` beside ``profile_memory``, as
torch's own export does: without operator inputs it can name almost no tensor), and the
optimizers stepped during the window name their parameters and state (torch finds those with its
Python tracer, which stepscope does not run): torch's in-memory results of the window, which no
trace file holds. Without torch, the Python heap's snapshots are the timeline, one category per
allocating module (with the allocation hook, the sampled modules' shares of the exact bytes
held), read from the window's trace (``stepscope_memory.by_module``, written by the memory
collector): the file written from a live profile is the one a reader of its saved trace
computes. The file's suffix picks the shape, as in torch: ``.html`` (a self-contained page),
``.json`` / ``.json.gz`` (``[times, sizes]``) and ``.raw.json.gz`` (rows
``[ts, action, bytes, category]``).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stepscope.atomic import atomic_output
from stepscope.collectors.memory import MemoryCollector
from stepscope.jsonenc import json_bytes
from stepscope.trace.memory_fields import heap_by_module
from stepscope.trace.model import Trace

__all__ = [
    "TORCH_CATEGORIES",
    "Timeline",
    "export_memory_timeline",
    "memory_timeline",
    "python_timeline",
    "write_timeline",
]

TORCH_CATEGORIES = (
    "PARAMETER",
    "OPTIMIZER_STATE",
    "INPUT",
    "TEMPORARY",
    "ACTIVATION",
    "GRADIENT",
    "AUTOGRAD_DETAIL",
    "unknown",
)
"""torch's category order in its timeline files (``None``, shown as unknown, last)."""
PREEXISTING, CREATE, INCREMENT_VERSION, DESTROY = 1, 2, 3, 4
SUFFIXES = (".raw.json.gz", ".json.gz", ".json", ".html")


@dataclass
class Timeline:
    """A memory timeline for one device: plot points, raw rows and category names."""

    device: str
    categories: list[str]
    times_us: list[int]
    sizes: list[list[int]]
    """Per time, bytes by category, after a leading 0 (torch's layout: index = category + 1)."""
    raw: list[tuple[int, int, int, int]]
    unknown_bytes: int = 0
    """Bytes created whose category could not be determined (``unknown``, never guessed)."""
    notes: list[str] = field(default_factory=list)


def _memory_collector(prof: Any) -> MemoryCollector:
    for collector in prof.collectors:
        if isinstance(collector, MemoryCollector):
            return collector
    raise RuntimeError(
        "export_memory_timeline needs profile_memory=True (profile(profile_memory=True) or "
        "`stepscope run --memory`)"
    )


def memory_timeline(prof: Any, device: str | None = None) -> Timeline:
    """The last window's memory timeline for ``device`` (``python``, ``cpu``, ``cuda:0``...)."""
    collector = _memory_collector(prof)
    window: Trace = prof._require_traces("export_memory_timeline()")[-1]
    result = collector.torch_result
    if device is None:
        device = _default_device(prof) if result is not None else "python"
    if device == "python":
        return python_timeline(window)
    if result is None:
        raise ValueError(
            f"device {device!r}: this window recorded no torch tensors (torch was not in use); "
            "use device='python' for the Python heap"
        )
    if not prof.record_shapes:
        raise ValueError(
            f"export_memory_timeline(device={device!r}) needs record_shapes=True with "
            "profile_memory=True (torch's categorizer reads operator inputs; torch's own export "
            "asks for it too): profile(profile_memory=True, record_shapes=True) or "
            "`stepscope run --memory --record-shapes`; device='python' works without it"
        )
    return torch_timeline(result.kineto_results, list(collector.optimizers.values()), device)


def _default_device(prof: Any) -> str:
    """torch's default: the profile's device (index 0), else CUDA 0 when present, else CPU."""
    if prof.use_device and prof.use_device != "cuda":
        return f"{prof.use_device}:0"
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def _mark_optimizers(profile: Any, optimizers: Sequence[Any]) -> None:
    """Name the parameters and state of the stepped optimizers in torch's categories."""
    from torch.profiler._memory_profiler import Category, TensorKey

    latest: dict[tuple[int, str], TensorKey] = {}
    for key in profile._size_map._values:
        if isinstance(key, TensorKey):
            where = (key.storage.ptr, str(key.device))
            if where not in latest or key.id > latest[where].id:
                latest[where] = key

    def mark(tensor: Any, category: Any) -> None:
        try:
            where = (tensor.untyped_storage().data_ptr(), str(tensor.device))
        except (AttributeError, RuntimeError):
            return
        key = latest.get(where)
        if key is not None:
            profile._categories.set_by_id(key, category)

    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for param in group["params"]:
                mark(param, Category.PARAMETER)
                for value in optimizer.state.get(param, {}).values():
                    if hasattr(value, "untyped_storage"):
                        mark(value, Category.OPTIMIZER_STATE)


def torch_timeline(kineto_results: Any, optimizers: Sequence[Any], device: str) -> Timeline:
    """torch's categorized timeline of one window's tensors on ``device``."""
    import torch
    from torch.profiler._memory_profiler import (
        Action,
        MemoryProfile,
        MemoryProfileTimeline,
        TensorKey,
    )

    profile = MemoryProfile(kineto_results)
    _mark_optimizers(profile, optimizers)
    timeline = MemoryProfileTimeline(profile)
    coalesce: Any = timeline._coalesce_timeline  # torch's own plot points
    times, sizes = coalesce(device)
    target = torch.device(device)
    unknown = len(TORCH_CATEGORIES) - 1

    def category(key: Any, version: int) -> int:
        found = timeline.categories.get(key, version) if isinstance(key, TensorKey) else None
        return unknown if found is None else TORCH_CATEGORIES.index(found.name)

    raw: list[tuple[int, int, int, int]] = []
    unknown_bytes = 0
    for t, action, (key, version), size in timeline.timeline:
        if key.device != target:
            continue
        if action in (Action.PREEXISTING, Action.CREATE):
            index = category(key, version)
            raw.append((t, action.value, size, index))
            unknown_bytes += size if index == unknown else 0
        elif action == Action.INCREMENT_VERSION:
            raw.append((t, action.value, -size, category(key, version)))
            raw.append((t, action.value, size, category(key, version + 1)))
        else:
            raw.append((t, action.value, -size, category(key, version)))
    notes = []
    if unknown_bytes:
        notes.append(f"{unknown_bytes:,} bytes of tensors could not be categorized (unknown)")
    return Timeline(device, list(TORCH_CATEGORIES), times, sizes, raw, unknown_bytes, notes)


def python_timeline(trace: Trace) -> Timeline:
    """The Python heap's snapshots in ``trace`` as a timeline, one category per allocating
    module (the biggest first)."""
    found = heap_by_module(trace)
    if found is None:
        raise ValueError(
            "this trace holds no Python heap by module (stepscope_memory.by_module): record it "
            "with profile_memory=True (a stepscope older than this one did not write it)"
        )
    by_module = [dict(zip(found.modules, held, strict=True)) for _, held in found.points]
    peak = {m: max((held[m] for held in by_module), default=0) for m in found.modules}
    categories = sorted(found.modules, key=lambda m: -peak[m])
    index = {m: i for i, m in enumerate(categories)}
    times = [t_ns // 1000 for t_ns, _ in found.points]
    sizes = [[0, *(held.get(m, 0) for m in categories)] for held in by_module]
    raw: list[tuple[int, int, int, int]] = []
    before: dict[str, int] = {}
    for t, held in zip(times, by_module, strict=True):
        for module in categories:
            delta = held.get(module, 0) - before.get(module, 0)
            if delta > 0:
                raw.append((t, CREATE, delta, index[module]))
            elif delta < 0:
                raw.append((t, DESTROY, delta, index[module]))
        before = held
    return Timeline("python", categories, times, sizes, raw)


def _suffix(path: str) -> str:
    for suffix in SUFFIXES:
        if path.endswith(suffix):
            return suffix
    raise ValueError(
        f"export_memory_timeline: cannot tell the format of {path!r} from its suffix; use "
        ".html (a page with the plot), .json or .json.gz (plot points) or .raw.json.gz "
        "(raw events)"
    )


def export_memory_timeline(prof: Any, path: str | os.PathLike[str], device: str | None) -> str:
    """Write the last window's memory timeline; the suffix picks the format as in torch."""
    _suffix(os.fspath(path))  # a path that names no format fails before any work
    return write_timeline(memory_timeline(prof, device), path)


def write_timeline(timeline: Timeline, path: str | os.PathLike[str]) -> str:
    """Write ``timeline`` in the format its suffix picks, as torch's export does."""
    target = os.fspath(path)
    suffix = _suffix(target)
    if suffix == ".html":
        from stepscope.report.memory import timeline_page

        data = timeline_page(timeline).encode("utf-8")
    elif suffix == ".raw.json.gz":
        data = gzip.compress(json_bytes([list(row) for row in timeline.raw]), compresslevel=6)
    else:
        data = json_bytes([timeline.times_us, timeline.sizes])
        if suffix == ".json.gz":
            data = gzip.compress(data, compresslevel=6)
    with atomic_output(target, what="memory timeline") as fh:
        fh.write(data)
    return target
