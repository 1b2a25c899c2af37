"""Activities a profile can record (defined in ``stepscope.activity``, below the collectors)."""

from __future__ import annotations

import sys

from stepscope.activity import ProfilerActivity, coerce_activities
from stepscope.collectors.torch import torch_installed

__all__ = [
    "EVENT_TYPES",
    "ProfilerActivity",
    "coerce_activities",
    "kineto_available",
    "supported_activities",
]

_DEVICE_TYPES = ("GPU_MEMCPY", "GPU_MEMSET", "CONCURRENT_KERNEL")
EVENT_TYPES: dict[str, frozenset[str]] = {
    "CPU": frozenset(
        {
            "CPU_OP",
            "CPU_INSTANT_EVENT",
            "USER_ANNOTATION",
            "EXTERNAL_CORRELATION",
            "XPU_RUNTIME",
            "XPU_DRIVER",
            "CUDA_RUNTIME",
            "CUDA_DRIVER",
            "PYTHON_FUNCTION",
            "PRIVATEUSE1_RUNTIME",
            "PRIVATEUSE1_DRIVER",
        }
    ),
    "CUDA": frozenset(
        {*_DEVICE_TYPES, "GPU_USER_ANNOTATION", "CUDA_RUNTIME", "CUDA_DRIVER", "OVERHEAD"}
    ),
    "XPU": frozenset({*_DEVICE_TYPES, "XPU_RUNTIME", "XPU_DRIVER"}),
    "MTIA": frozenset({"MTIA_CCP_EVENTS", "MTIA_RUNTIME", "MTIA_INSIGHT", "MTIA_COUNTERS"}),
    "HPU": frozenset({"HPU_OP"}),
    "PrivateUse1": frozenset(
        {*_DEVICE_TYPES, "GPU_USER_ANNOTATION", "PRIVATEUSE1_RUNTIME", "PRIVATEUSE1_DRIVER"}
    ),
}
"""The event types torch's profiler records for each activity: what a dict filter may name."""


def kineto_available() -> bool:
    """Whether torch's profiler (Kineto) can record here: torch is installed and built with it."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return bool(torch.autograd.kineto_available())
    return torch_installed()


def supported_activities() -> set[ProfilerActivity]:
    """The activities a profile can record here (torch's devices once torch is imported)."""
    found = {ProfilerActivity.CPU, ProfilerActivity.PYTHON, ProfilerActivity.SAMPLING}
    torch = sys.modules.get("torch")
    if torch is not None:
        for activity in torch.autograd._supported_activities():
            name = getattr(activity, "name", str(activity))
            if name in ProfilerActivity.__members__:
                found.add(ProfilerActivity[name])
    return found
