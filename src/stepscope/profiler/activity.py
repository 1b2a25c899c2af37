"""Activities a profile can record (defined in ``stepscope.activity``, below the collectors)."""

from __future__ import annotations

import sys

from stepscope.activity import ProfilerActivity, coerce_activities
from stepscope.collectors.torch import torch_installed

__all__ = ["ProfilerActivity", "coerce_activities", "kineto_available", "supported_activities"]


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
