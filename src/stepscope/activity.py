"""Activities a profile can record; torch.profiler.ProfilerActivity values are accepted too."""

from __future__ import annotations

import enum
from collections.abc import Iterable

__all__ = ["ProfilerActivity", "coerce_activities"]


class ProfilerActivity(enum.Enum):
    """What to record.  CPU, CUDA, XPU, MTIA and PrivateUse1 mirror torch's names."""

    CPU = "CPU"
    """Annotations always; torch operators when torch is installed."""
    CUDA = "CUDA"
    XPU = "XPU"
    MTIA = "MTIA"
    HPU = "HPU"
    PrivateUse1 = "PrivateUse1"
    PYTHON = "PYTHON"
    """Every Python function call (the deterministic tracer), like ``with_stack=True``."""
    SAMPLING = "SAMPLING"
    """Statistical stacks from the in-process sampler."""


def coerce_activities(values: Iterable[object] | None) -> set[ProfilerActivity]:
    """Normalize activities given as stepscope or torch enums (or their names)."""
    if values is None:
        return {ProfilerActivity.CPU}
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(
            f"activities must be an iterable of ProfilerActivity values, got {values!r} "
            "(a list, e.g. activities=[ProfilerActivity.CPU])"
        )
    result = set()
    for value in values:
        name = value if isinstance(value, str) else getattr(value, "name", None)
        if not isinstance(name, str) or name not in ProfilerActivity.__members__:
            known = ", ".join(ProfilerActivity.__members__)
            raise ValueError(f"unknown profiler activity {value!r}; known activities: {known}")
        result.add(ProfilerActivity[name])
    if not result:
        raise ValueError("activities is empty: pass at least one ProfilerActivity (e.g. CPU)")
    return result
