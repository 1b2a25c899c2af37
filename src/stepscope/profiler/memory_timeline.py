"""``profile.export_memory_timeline``: torch's memory timeline files, for torch and plain Python.

With torch's data the timeline is torch's own: ``torch.profiler._memory_profiler.MemoryProfile``
categorizes the window's tensors (it needs ``record_shapes=True`` beside ``profile_memory``, as
torch's own export does: without operator inputs it can name almost no tensor), and the
optimizers stepped during the window name their parameters and state (torch finds those with its
Python tracer, which stepscope does not run). Without torch, the Python heap's snapshots are the
timeline, one category per allocating module (with the allocation hook, the sampled modules'
shares of the exact bytes held). The file's suffix picks the shape, as in torch: ``.html`` (a
self-contained page), ``.json`` / ``.json.gz`` (``[times, sizes]``) and ``.raw.json.gz`` (rows
``[ts, action, bytes, category]``).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stepscope import clock
from stepscope.atomic import atomic_output
from stepscope.collectors.memory import MemoryCollector, PythonHeapPoint, module_of
from stepscope.jsonenc import json_bytes

__all__ = ["TORCH_CATEGORIES", "Timeline", "export_memory_timeline", "memory_timeline"]

UNSAMPLED = "(no sample)"
"""The category of bytes held when no sampled allocation was alive to name their module."""

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
    prof._require_traces("export_memory_timeline()")
    result = collector.torch_result
    if device is None:
        device = _default_device(prof) if result is not None else "python"
    if device == "python":
        return python_timeline(collector.python_points)
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


def python_timeline(points: Sequence[PythonHeapPoint]) -> Timeline:
    """The Python heap's snapshots as a timeline, one category per allocating module."""
    by_module: list[dict[str, int]] = []
    for point in points:
        held: dict[str, int] = {}
        for (file, _line), (size, _count) in point.sites.items():
            module = module_of(file)
            held[module] = held.get(module, 0) + size
        by_module.append(_scaled(held, point.total))
    peak: dict[str, int] = {}
    for held in by_module:
        for module, size in held.items():
            peak[module] = max(peak.get(module, 0), size)
    categories = sorted(peak, key=lambda m: -peak[m])
    index = {m: i for i, m in enumerate(categories)}
    times = [clock.to_unix_ns(p.t_ns) // 1000 for p in points]
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


def _scaled(held: dict[str, int], total: int | None) -> dict[str, int]:
    """Sampled shares scaled to the exact total held (the remainder to the biggest module)."""
    if total is None:
        return held
    sampled = sum(held.values())
    if sampled <= 0:
        return {UNSAMPLED: total} if total > 0 else {}
    out = {module: size * total // sampled for module, size in held.items()}
    biggest = max(out, key=lambda m: out[m])
    out[biggest] += total - sum(out.values())
    return out


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
    target = os.fspath(path)
    suffix = _suffix(target)
    timeline = memory_timeline(prof, device)
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
