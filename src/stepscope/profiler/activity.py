"""What the profiler knows of activities here: what torch records, supports and defaults to.

The activities themselves are ``stepscope.activity.ProfilerActivity`` (below the collectors).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping

from stepscope.activity import ProfilerActivity
from stepscope.extras import torch_installed

__all__ = [
    "EVENT_TYPES",
    "default_activities",
    "kineto_available",
    "split_activity_filters",
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


DEVICE_PREFERENCE = ("CUDA", "XPU", "MTIA", "HPU", "PrivateUse1")
"""The device a default profile records when torch offers more than one (it records one)."""


def default_activities() -> set[ProfilerActivity]:
    """What ``activities=None`` records, as in torch.profiler: the CPU, and the device torch
    records here (CUDA on an NVIDIA machine) once the program has imported torch."""
    found = {ProfilerActivity.CPU}
    if "torch" in sys.modules:
        supported = {activity.name for activity in supported_activities()}
        device = next((name for name in DEVICE_PREFERENCE if name in supported), None)
        if device is not None:
            found.add(ProfilerActivity[device])
    return found


def split_activity_filters(
    activities: Iterable[object] | None,
) -> tuple[list[object] | None, dict[str, list[str]]]:
    """torch's mixed activity list: plain activities, and ``{activity: [type names]}`` filters.

    Returns the activities and the filters keyed by activity name; an activity named twice is
    a ``ValueError`` (as in torch).
    """
    if activities is None or isinstance(activities, (str, bytes)):
        return activities, {}  # type: ignore[return-value]  # coerce_activities says why
    if not isinstance(activities, Iterable):
        raise TypeError(
            f"activities must be an iterable of ProfilerActivity values, got {activities!r}"
        )
    plain: list[object] = []
    filters: dict[str, list[str]] = {}
    seen: set[str] = set()

    def note(activity: object) -> str:
        name = activity if isinstance(activity, str) else getattr(activity, "name", None)
        if not isinstance(name, str):
            raise TypeError(f"Expected ProfilerActivity or dict, got {type(activity)}")
        if name in seen:
            raise ValueError(f"Activity {activity} specified more than once")
        seen.add(name)
        return name

    for item in activities:
        if isinstance(item, Mapping):
            for activity, types in item.items():
                name = note(activity)
                if name not in EVENT_TYPES:  # CPU and the devices
                    raise ValueError(
                        f"activity filters select torch's event types; {name} is recorded by "
                        "stepscope itself and takes no filter: list it without a dict"
                    )
                if isinstance(types, (str, bytes)) or not isinstance(types, Iterable):
                    raise TypeError(
                        f"the filter of {name} must be a list of activity type names, got {types!r}"
                    )
                filters[name] = [str(t) for t in types]
                _check_event_types(name, filters[name])
                plain.append(activity)
        else:
            note(item)
            plain.append(item)
    return plain, filters


def _check_event_types(activity: str, types: list[str]) -> None:
    """torch's check of a dict filter, made when the profile is built (not when it starts)."""
    known = EVENT_TYPES.get(activity, frozenset())
    for name in types:
        if name not in known:
            raise RuntimeError(
                f"Unknown or non-member activity type name: {name!r}; the event types of "
                f"{activity} are {', '.join(sorted(known))}"
            )
